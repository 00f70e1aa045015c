// The dashboard's key lookup: a zone and a key (raw, or its digest), the
// key's state in the zone (POST keys?zone=Z, the key as the body: a key of
// any length, whatever the header limit of the server serving the page),
// and a button that resets it across the fleet (DELETE, the same). Kept apart from
// dashboard.js: it builds its own section. Every value goes into the page
// as text (keys with log_key are client input).
"use strict";

(() => {
  function node(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children) e.append(c);
    return e;
  }

  const zone = node("input", { id: "key-zone", name: "zone", placeholder: "zone", list: "key-zones", size: "14", required: "" });
  const zones = node("datalist", { id: "key-zones" });
  const key = node("input", { id: "key-key", name: "key", placeholder: "key or key digest", size: "40", required: "" });
  const look = node("button", { type: "submit", id: "key-look" }, "look up");
  const reset = node("button", { type: "button", id: "key-reset", title: "make this key's buckets full again on every node", disabled: "" }, "reset");
  const note = node("div", { id: "key-note", class: "lasterror" });
  const rows = node("tbody", { id: "key-rows" });
  const form = node("form", { id: "key-form", class: "keyform" }, zone, zones, key, look, reset);
  const section = node("section", { id: "keys", class: "feed", "aria-label": "Key lookup" },
    node("h2", {}, "Key lookup ", node("span", { class: "feed-source" }, "· a key's buckets, ban and slots, without charging it")),
    form, note,
    node("table", { class: "list keys" },
      node("thead", {}, node("tr", {},
        ...["store", "key", "rule", "remaining", "full in", "ban", "slots", "last rule"].map(h => node("th", {}, h)))),
      rows));
  const anchor = document.getElementById("bans") || document.getElementById("feed");
  if (anchor) anchor.before(section); else document.body.append(section);

  function fmtRule(r) {
    if (r.quota) return `quota ${r.quota.used} of ${r.rate} per ${r.per}`;
    return r.tier ? r.tier : `${r.algorithm} ${r.rate}/${r.per}, burst ${r.burst}`;
  }

  function render(body) {
    note.textContent = body.note || body.stores.filter(s => s.error).map(s => `${s.name}: ${s.error}`).join(" · ");
    const list = [];
    for (const k of body.keys) {
      const name = (k.zone !== body.zone ? k.zone + ": " : "") + (k.key || k.key_digest) +
        (k.alternative > 1 ? ` (alternative ${k.alternative})` : "");
      const ban = k.ban ? `until ${new Date(k.ban.until).toLocaleTimeString()} (${k.ban.seconds_left} s)` :
        (k.denials_towards_ban ? `${k.denials_towards_ban} denials counted` : "none");
      const last = k.last_rule ? fmtRule(k.last_rule) : "unknown here";
      if (k.error) {
        list.push(node("tr", { class: "key-row" }, node("td", {}, k.store), node("td", { class: "key" }, name),
          node("td", { colspan: "6", class: "lasterror" }, k.error)));
        continue;
      }
      for (const r of k.rules) {
        list.push(node("tr", { class: "key-row", "data-full": String(r.full) },
          node("td", {}, k.store),
          node("td", { class: "key" }, name),
          node("td", {}, fmtRule(r)),
          node("td", { class: "n key-remaining" }, String(r.remaining)),
          node("td", { class: "n", title: r.reset }, r.full ? "full" : r.reset_seconds + " s"),
          node("td", {}, ban),
          node("td", { class: "n" }, r.slots_held === undefined ? "" : String(r.slots_held)),
          node("td", {}, last)));
      }
    }
    if (list.length === 0) list.push(node("tr", { class: "none" }, node("td", { colspan: "8" }, "no bucket")));
    rows.replaceChildren(...list);
    section.dataset.lookups = String(Number(section.dataset.lookups || 0) + 1);
  }

  function send(method) {
    const url = "keys?" + new URLSearchParams({ zone: zone.value.trim() }).toString();
    return fetch(url, { method, body: key.value, cache: "no-store" });
  }

  async function lookUp() {
    try {
      const resp = await send("POST");
      const text = await resp.text();
      if (!resp.ok) throw new Error(`HTTP ${resp.status}: ${text}`);
      render(JSON.parse(text));
      reset.disabled = false;
    } catch (err) {
      note.textContent = "lookup failed: " + err.message;
      rows.replaceChildren();
      reset.disabled = true;
    }
  }

  form.addEventListener("submit", ev => { ev.preventDefault(); lookUp(); });
  reset.addEventListener("click", async () => {
    reset.disabled = true;
    try {
      const resp = await send("DELETE");
      const text = await resp.text();
      if (!resp.ok) throw new Error(`HTTP ${resp.status}: ${text}`);
      const body = JSON.parse(text);
      section.dataset.resets = String(Number(section.dataset.resets || 0) + 1);
      await lookUp();
      if (body.error) note.textContent = "reset, but: " + body.error;
    } catch (err) {
      note.textContent = "reset failed: " + err.message;
      reset.disabled = false;
    }
  });

  // The zones to choose from: those of the statistics, once.
  fetch("stats?series=0", { cache: "no-store" }).then(r => r.ok ? r.json() : null).then(body => {
    if (!body) return;
    const names = [...new Set(body.zones.map(z => z.name))].sort();
    zones.replaceChildren(...names.map(n => node("option", { value: n })));
    if (!zone.value && names.length === 1) zone.value = names[0];
  }).catch(() => {});
})();
