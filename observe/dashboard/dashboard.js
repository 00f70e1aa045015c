// The rate limit dashboard: polls stats and the denial feed once a second
// and draws what they say. No library, nothing from another origin. Every
// value from them goes into the page as text (client keys with log_key,
// hosts and paths are client input).
"use strict";

const POLL_MS = 1000;
const FEED_ROWS = 50;
// CLOCK_WARN_MS is the clock offset the store card flags, as the alert
// docs/observability.md suggests.
const CLOCK_WARN_MS = 50;
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function fmtRate(v) {
  if (v === 0) return "0";
  if (v >= 100) return v.toFixed(0);
  if (v >= 10) return v.toFixed(1);
  return v.toFixed(2);
}

function fmtMs(v) {
  if (v >= 100) return v.toFixed(0) + " ms";
  if (v >= 1) return v.toFixed(1) + " ms";
  return (v * 1000).toFixed(0) + " µs";
}

// passed and rejected sum a zone's outcome rates the way the charts do.
function passed(r) { return r.allowed + r.local_allowed + r.failed_open; }
function rejected(r) { return r.denied + r.local_denied + r.failed_closed; }

// niceMax rounds a chart's top up to 1, 2 or 5 times a power of ten.
function niceMax(v) {
  if (v <= 1) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

const W = 600, H = 170, L = 34, R = 6, T = 8, B = 18;

// Chart is one SVG chart of allowed and denied per second.
class Chart {
  constructor(kind) {
    this.root = svg("svg", { class: "chart " + kind, viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    this.grid = svg("g");
    this.aArea = svg("path", { class: "allowed-area" });
    this.dArea = svg("path", { class: "denied-area" });
    this.aLine = svg("path", { class: "allowed" });
    this.dLine = svg("path", { class: "denied" });
    this.root.append(this.grid, this.aArea, this.dArea, this.aLine, this.dLine);
  }

  draw(series, label) {
    const a = series ? series.allowed : [], d = series ? series.denied : [];
    const n = Math.max(a.length, 2);
    const top = niceMax(Math.max(1, ...a, ...d));
    const x = (i) => L + (i * (W - L - R)) / (n - 1);
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const line = (vals) => vals.map((v, i) => (i ? "L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1)).join("");
    const area = (vals) => vals.length ? line(vals) + `L${x(vals.length - 1).toFixed(1)} ${y(0)}L${x(0).toFixed(1)} ${y(0)}Z` : "";
    this.aLine.setAttribute("d", line(a));
    this.dLine.setAttribute("d", line(d));
    this.aArea.setAttribute("d", area(a));
    this.dArea.setAttribute("d", area(d));

    this.grid.replaceChildren();
    for (const v of [0, top / 2, top]) {
      this.grid.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      const t = svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" });
      t.textContent = Number.isInteger(v) ? String(v) : v.toFixed(1);
      this.grid.append(t);
    }
    const minutes = Math.round(n / 60);
    for (let m = minutes; m >= 0; m--) {
      const i = n - 1 - m * 60;
      if (i < 0) continue;
      const t = svg("text", { x: x(i), y: H - 4, "text-anchor": m === 0 ? "end" : "middle" });
      t.textContent = m === 0 ? "now" : `-${m}m`;
      this.grid.append(t);
    }
    this.root.setAttribute("aria-label", label);
    this.root.dataset.end = series ? series.end : 0;
    this.root.dataset.allowedSum = a.reduce((s, v) => s + v, 0);
    this.root.dataset.deniedSum = d.reduce((s, v) => s + v, 0);
  }
}

function ratesLine(rates) {
  const box = el("div", { class: "rates" });
  for (const [name, r] of [["1 s", rates["1s"]], ["10 s", rates["10s"]], ["60 s", rates["60s"]]]) {
    const a = el("span", { class: "a" }, fmtRate(passed(r)));
    const d = el("span", { class: "d" }, fmtRate(rejected(r)));
    box.append(el("span", {}, name + ": ", a, " / ", d, " /s"));
  }
  return box;
}

// ZoneCard is one zone's card, kept across updates.
class ZoneCard {
  constructor(name, store) {
    this.root = el("section", { class: "zone", "data-zone": name, "data-store": store });
    this.title = el("h2");
    this.rule = el("div", { class: "rule" });
    this.localRates = el("div");
    this.localChart = new Chart("local");
    this.fleetTitle = el("h3", {}, "Fleet");
    this.fleetRates = el("div");
    this.fleetChart = new Chart("fleet");
    this.fleetError = el("div", { class: "fleet-error" });
    this.topBody = el("tbody");
    this.topTitle = el("h3", {}, "Top denied keys");
    this.netsBody = el("tbody");
    this.netsTitle = el("h3", { class: "nets-title" }, "Top denied networks");
    const legend = () => el("div", { class: "legend" }, el("span", { class: "a" }, "allowed"), " ", el("span", { class: "d" }, "denied"), " per second");
    this.fleetPanel = el("div", { class: "panel fleet" }, this.fleetTitle, this.fleetRates, this.fleetChart.root, this.fleetError, legend());
    const table = el("table", { class: "list top" },
      el("thead", {}, el("tr", {}, el("th", {}, "#"), el("th", {}, "key"), el("th", { class: "n" }, "denied"))),
      this.topBody);
    const nets = el("table", { class: "list nets" },
      el("thead", {}, el("tr", {}, el("th", {}, "#"), el("th", {}, "network"), el("th", { class: "n" }, "denied"))),
      this.netsBody);
    this.root.append(this.title, this.rule,
      el("div", { class: "panels" },
        el("div", { class: "panel local" }, el("h3", {}, "This node"), this.localRates, this.localChart.root, legend()),
        this.fleetPanel,
        el("div", { class: "panel top" }, this.topTitle, table, this.netsTitle, nets)));
  }

  // update shows z; shared says another zone of its name is shown (on
  // another store), so the title names the store too.
  update(z, shared) {
    this.title.textContent = shared ? `${z.name} · ${z.store}` : z.name;
    const rule = z.rate ? `${z.rate} per ${z.per}` + (z.burst && z.algorithm === "token_bucket" ? `, burst ${z.burst}` : "") : "";
    this.rule.textContent = [rule, z.algorithm, "on_error " + (z.on_error || "local"), "store " + z.store,
      `deny cache hits ${z.deny_cache_hits}`, `evictions ${z.evictions || 0}`].filter(Boolean).join(" · ");
    this.localRates.replaceChildren(ratesLine(z.rates));
    this.localChart.draw(z.series, `${z.name}: allowed and denied per second on this node`);

    if (z.fleet) {
      this.fleetPanel.hidden = false;
      const nodes = z.fleet.nodes.length;
      this.fleetTitle.textContent = `Fleet · ${nodes} node${nodes === 1 ? "" : "s"}`;
      this.fleetTitle.title = z.fleet.nodes.join("\n");
      this.fleetRates.replaceChildren(ratesLine(z.fleet.rates));
      this.fleetChart.draw(z.fleet.series, `${z.name}: allowed and denied per second across the fleet`);
      this.fleetError.textContent = z.fleet.error ? "fleet view unavailable: " + z.fleet.error : "";
    } else {
      this.fleetPanel.hidden = true;
    }

    const since = new Date(z.top_denied.since * 1000);
    this.topTitle.textContent = `Top denied keys since ${since.toLocaleTimeString()}` + (z.top_denied.hashed ? " (digests)" : "");
    const rows = z.top_denied.keys.map((k, i) => el("tr", {},
      el("td", {}, String(i + 1)),
      el("td", { class: "key" }, k.key),
      el("td", { class: "n", title: k.error ? `may be over by up to ${k.error}` : "exact" }, String(k.denied) + (k.error ? ` ±${k.error}` : ""))));
    if (rows.length === 0) rows.push(el("tr", { class: "none" }, el("td", { colspan: "3" }, "nobody denied")));
    this.topBody.replaceChildren(...rows);

    const tn = z.top_networks || { since: z.top_denied.since, networks: [] };
    this.netsTitle.textContent = `Top denied networks since ${new Date(tn.since * 1000).toLocaleTimeString()}`;
    const netRows = tn.networks.map((n, i) => el("tr", {},
      el("td", {}, String(i + 1)),
      el("td", { class: "key" }, n.network),
      el("td", { class: "n", title: n.error ? `may be over by up to ${n.error}` : "exact" }, String(n.denied) + (n.error ? ` ±${n.error}` : ""))));
    if (netRows.length === 0) netRows.push(el("tr", { class: "none" }, el("td", { colspan: "3" }, "no network denied")));
    this.netsBody.replaceChildren(...netRows);
  }
}

// fmtCount shows a count with thousands separators: 500,000.
function fmtCount(n) {
  return Number(n).toLocaleString("en-US");
}

function fmtBytes(n) {
  if (n >= 1 << 30) return (n / (1 << 30)).toFixed(1) + " GiB";
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + " MiB";
  if (n >= 1 << 10) return (n / (1 << 10)).toFixed(1) + " KiB";
  return n + " B";
}

// fmtOffset shows a clock offset in milliseconds, signed.
function fmtOffset(ms) {
  const sign = ms > 0 ? "+" : ms < 0 ? "−" : "";
  const a = Math.abs(ms);
  return sign + (a >= 100 ? a.toFixed(0) : a >= 1 ? a.toFixed(1) : a.toFixed(2)) + " ms";
}

function storeCard(s) {
  const kv = el("div", { class: "kv" });
  const add = (k, v, cls) => kv.append(el("span", {}, k + " ", el("b", cls ? { class: cls } : {}, v)));
  if (s.kind === "redis") {
    add("breaker", s.breaker);
    add("calls", fmtRate(s.calls_per_second) + "/s");
    add("errors", fmtRate(s.errors_per_second) + "/s");
    const l = s.latency_ms;
    if (l && l.calls > 0) {
      add("p50", fmtMs(l.p50));
      add("p90", fmtMs(l.p90));
      add("p99", fmtMs(l.p99));
      add("max", fmtMs(l.max));
    }
    add("timeouts", String(s.errors.timeout));
    add("out of memory", String(s.errors.oom || 0));
    add("auth", String(s.errors.auth || 0));
    add("failures", String(s.errors.error));
    if (s.clock) {
      const warn = Math.abs(s.clock.offset_ms) > CLOCK_WARN_MS;
      kv.append(el("span", { class: "clock", title: `Redis' clock minus this node's (negative: this node is ahead), within ±${fmtMs(s.clock.round_trip_ms / 2)}` },
        "clock offset ", el("b", warn ? { class: "warn" } : {}, fmtOffset(s.clock.offset_ms))));
    }
    const m = s.memory;
    if (m) {
      add("memory", fmtBytes(m.used_bytes) + (m.max_bytes ? " of " + fmtBytes(m.max_bytes) : " (no maxmemory)"));
      add("policy", m.policy);
      add("evicted keys", String(m.evicted_keys));
    }
  } else {
    add("kind", "in-process memory (this node only)");
    if (s.max_keys) add("keys", `${fmtCount(s.keys || 0)} of ${fmtCount(s.max_keys)}`);
  }
  const card = el("div", { class: "store", "data-store": s.name },
    el("div", {}, el("span", { class: "name" }, s.name), el("span", { class: "badge " + s.status }, s.status)), kv);
  if (s.last_error && s.status !== "ok") {
    card.append(el("div", { class: "lasterror" }, `last error ${new Date(s.last_error.time).toLocaleTimeString()}: ${s.last_error.message}`));
  }
  if (s.memory && s.memory.warning) {
    card.append(el("div", { class: "lasterror" }, "Redis memory: " + s.memory.warning));
  }
  if (s.fleet && s.fleet.last_error) {
    card.append(el("div", { class: "lasterror" }, "fleet view: " + s.fleet.last_error.message));
  }
  if (s.feed && s.feed.last_error) {
    card.append(el("div", { class: "lasterror" }, "denial feed: " + s.feed.last_error.message));
  }
  return card;
}

// renderFeed shows the denial feed: the fleet's (from Redis) or this
// node's own denials, newest first.
function renderFeed(feed) {
  const sources = feed.stores.map(s => s.source === "fleet" ? `fleet (${s.name})` : `this node (${s.name})`);
  document.getElementById("feed-source").textContent = sources.length ? "· " + sources.join(", ") : "";
  document.getElementById("feed-error").textContent = feed.stores.filter(s => s.error)
    .map(s => `${s.name}: ${s.error}; showing this node's own denials`).join(" · ");
  const rows = feed.denials.map(d => {
    const flags = el("td", {});
    if (d.banned) flags.append(el("span", { class: "flag" }, "banned"));
    if (d.dry_run) flags.append(el("span", { class: "flag dry" }, "dry run"));
    return el("tr", { class: "denial", "data-node": d.node, "data-zone": d.zone },
      el("td", { title: new Date(d.time).toISOString() }, new Date(d.time).toLocaleTimeString()),
      el("td", {}, d.zone),
      el("td", { class: "mono" }, d.client_ip || "?"),
      el("td", { class: "key", title: d.key ? "key" : "key digest" }, d.key || d.key_digest),
      // Without log_key a denial has no path: its zone's route instead.
      el("td", { class: "req", title: d.path ? "path" : "zone's route" },
        d.path ? `${d.method} ${d.host}${d.path}` : `${d.method} ${d.host} ${d.route || "(every request)"}`),
      el("td", { class: "mono" }, d.node),
      flags);
  });
  if (rows.length === 0) rows.push(el("tr", { class: "none" }, el("td", { colspan: "7" }, "nothing denied lately")));
  document.getElementById("feed-rows").replaceChildren(...rows);
}

const cards = new Map();

// render shows the stats. A zone is one card per store: zones of one name
// on several stores are distinct entries, titled with their store's name.
function render(stats) {
  document.getElementById("node").textContent = "node " + stats.node;
  document.getElementById("stores").replaceChildren(...stats.stores.map(storeCard));
  const main = document.getElementById("zones");
  const named = new Map();
  for (const z of stats.zones) named.set(z.name, (named.get(z.name) || 0) + 1);
  const seen = new Set();
  for (const z of stats.zones) {
    let id = z.name + "\u0000" + z.store;
    for (let n = 2; seen.has(id); n++) id = z.name + "\u0000" + z.store + "\u0000" + n;
    let card = cards.get(id);
    if (!card) {
      card = new ZoneCard(z.name, z.store);
      cards.set(id, card);
    }
    card.update(z, named.get(z.name) > 1);
    main.append(card.root); // keeps the order of the stats
    seen.add(id);
  }
  for (const [id, card] of cards) {
    if (!seen.has(id)) {
      card.root.remove();
      cards.delete(id);
    }
  }
  document.getElementById("empty").hidden = stats.zones.length > 0;
}

// pollFeed reads the denial feed; a failure shows in its section and does
// not stop the stats.
async function pollFeed() {
  try {
    const resp = await fetch(`denials?limit=${FEED_ROWS}`, { cache: "no-store" });
    if (!resp.ok) throw new Error(`denials: HTTP ${resp.status}`);
    renderFeed(await resp.json());
  } catch (err) {
    document.getElementById("feed-error").textContent = "denial feed unavailable: " + err.message;
  }
}

async function poll() {
  const status = document.getElementById("status");
  const feed = pollFeed();
  try {
    const resp = await fetch("stats", { cache: "no-store" });
    if (!resp.ok) throw new Error(`stats: HTTP ${resp.status}`);
    render(await resp.json());
    await feed;
    document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
    status.textContent = "live · " + new Date().toLocaleTimeString();
    status.className = "status live";
  } catch (err) {
    status.textContent = "disconnected: " + err.message;
    status.className = "status error";
  }
  setTimeout(poll, POLL_MS);
}

poll();
