// The dashboard's bans: polls the bans in force once a second and lists
// them, each with a button that lifts it across the fleet (DELETE). Kept
// apart from dashboard.js: it builds its own section. Every value goes into
// the page as text (client keys with log_key are client input).
"use strict";

(() => {
  const BANS_POLL_MS = 1000;

  function node(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children) e.append(c);
    return e;
  }

  // fmtLeft shows a ban's time left: seconds, minutes, hours.
  function fmtLeft(s) {
    if (s < 120) return s + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    return Math.round(s / 3600) + " h";
  }

  const rows = node("tbody", { id: "ban-rows" });
  const status = node("div", { id: "ban-status", class: "lasterror" }); // the stores' errors
  const note = node("div", { id: "ban-note", class: "lasterror" }); // the last lift's
  const section = node("section", { id: "bans", class: "feed", "aria-label": "Current bans" },
    node("h2", {}, "Current bans ", node("span", { id: "ban-count", class: "feed-source" })),
    status,
    note,
    node("table", { class: "list bans" },
      node("thead", {}, node("tr", {},
        ...["zone", "key", "since", "ends", "left", "denials", ""].map(h => node("th", {}, h)))),
      rows));
  const feed = document.getElementById("feed");
  if (feed) feed.before(section); else document.body.append(section);

  // lift asks for the ban to be lifted, then lists the bans again.
  async function lift(ban, button) {
    button.disabled = true;
    const key = ban.key || ban.key_digest;
    try {
      const q = new URLSearchParams({ zone: ban.zone, key: key });
      const resp = await fetch("bans?" + q.toString(), { method: "DELETE", cache: "no-store" });
      const text = await resp.text();
      if (!resp.ok) throw new Error(`HTTP ${resp.status}: ${text}`);
      const body = JSON.parse(text);
      note.textContent = body.error ? "lifted, but: " + body.error : "";
      section.dataset.lifted = String(Number(section.dataset.lifted || 0) + 1);
    } catch (err) {
      note.textContent = `lifting ${ban.zone}/${key} failed: ${err.message}`;
      button.disabled = false;
    }
    await poll(false);
  }

  function render(body) {
    const errors = body.stores.filter(s => s.error).map(s => `${s.name}: ${s.error}`);
    status.textContent = errors.join(" · ");
    const sources = body.stores.map(s => s.source === "fleet" ? `fleet (${s.name})` : `this node (${s.name})`);
    document.getElementById("ban-count").textContent =
      `· ${body.bans.length} · ` + (sources.length ? sources.join(", ") : "no store with bans");
    const list = body.bans.map(b => {
      const button = node("button", { type: "button", class: "lift", title: "lift this ban on every node" }, "lift");
      button.addEventListener("click", () => lift(b, button));
      return node("tr", { class: "ban", "data-zone": b.zone, "data-key": b.key || b.key_digest },
        node("td", {}, b.zone),
        node("td", { class: "key", title: b.key ? "key" : "key digest" }, b.key || b.key_digest),
        node("td", { class: "n", title: b.start }, new Date(b.start).toLocaleTimeString()),
        node("td", { class: "n", title: b.end }, new Date(b.end).toLocaleTimeString()),
        node("td", { class: "n" }, fmtLeft(b.seconds_left)),
        node("td", { class: "n" }, String(b.denials)),
        node("td", {}, button));
    });
    if (list.length === 0) list.push(node("tr", { class: "none" }, node("td", { colspan: "7" }, "no key is banned")));
    rows.replaceChildren(...list);
  }

  // poll lists the bans; with again, it polls again a second later.
  async function poll(again) {
    try {
      const resp = await fetch("bans", { cache: "no-store" });
      if (!resp.ok) throw new Error(`bans: HTTP ${resp.status}`);
      render(await resp.json());
      section.dataset.updates = String(Number(section.dataset.updates || 0) + 1);
    } catch (err) {
      status.textContent = "bans unavailable: " + err.message;
    }
    if (again) setTimeout(() => poll(true), BANS_POLL_MS);
  }

  poll(true);
})();
