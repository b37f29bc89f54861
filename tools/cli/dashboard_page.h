// The page `simba dashboard` serves at "/": self-contained (inline CSS and JS,
// nothing fetched from elsewhere), static (the server inserts no data into it;
// the script reads /api/state and fills the DOM with textContent only).
//
// Stable hooks for tests and scripts: each mutex is a `tr[data-mutex=NAME]`
// with cells `.owner`, `.token`, `.countdown`, `.waiters` (one `.waiter` per
// contender); hand-overs are `#handovers li[data-mutex][data-from][data-to]`
// (empty from/to: free); `#error` is the store-error banner, `#store` the
// store (password masked), `#transport` how it is reached ("plain text",
// "TLS (verify)", ...), `#refreshed` the time of the last good read.
#ifndef SIMBA_TOOLS_CLI_DASHBOARD_PAGE_H_
#define SIMBA_TOOLS_CLI_DASHBOARD_PAGE_H_

namespace simba::cli {

inline constexpr char kDashboardPage[] = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>simba dashboard</title>
<style>
  :root {
    color-scheme: light dark;
    --fg: #1d232a; --muted: #68707a; --bg: #fff; --line: #e3e6ea;
    --held: #0b7a3e; --warn: #b3261e; --warn-bg: #fdecea;
  }
  @media (prefers-color-scheme: dark) {
    :root {
      --fg: #e6e8eb; --muted: #9aa3ad; --bg: #15181c; --line: #2c3137;
      --held: #4cc38a; --warn: #ff8a80; --warn-bg: #3b1f1d;
    }
  }
  body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: var(--fg); background: var(--bg); }
  header { padding: 12px 20px; border-bottom: 1px solid var(--line);
           display: flex; gap: 20px; align-items: baseline; flex-wrap: wrap; }
  h1 { font-size: 16px; margin: 0; }
  h2 { font-size: 13px; margin: 0 0 6px; color: var(--muted); text-transform: uppercase;
       letter-spacing: .04em; }
  .meta { color: var(--muted); }
  main { padding: 12px 20px; display: grid; gap: 24px; }
  .banner { background: var(--warn-bg); color: var(--warn); border: 1px solid var(--warn);
            padding: 8px 12px; border-radius: 4px; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line);
           vertical-align: top; }
  th { font-weight: 600; color: var(--muted); font-size: 12px; }
  .token, .countdown { font-variant-numeric: tabular-nums; text-align: right; }
  code, .name, .owner, .waiters, #handovers { font-family: ui-monospace, monospace; font-size: 13px; }
  tr.free .owner, .cannot-tell, .empty { color: var(--muted); }
  tr.held .owner { color: var(--held); }
  .cannot-tell { font-style: italic; font-family: system-ui, sans-serif; }
  .countdown.expired { color: var(--warn); }
  #handovers { list-style: none; padding: 0; margin: 0; }
  #handovers li { padding: 3px 0; border-bottom: 1px solid var(--line); }
  #handovers .at { color: var(--muted); }
</style>
</head>
<body>
<header>
  <h1>simba dashboard</h1>
  <span class="meta">store <code id="store">&hellip;</code> over <span id="transport">&hellip;</span></span>
  <span class="meta">last read <span id="refreshed">never</span></span>
</header>
<main>
  <div id="error" class="banner" role="alert" hidden></div>
  <div id="offline" class="banner" role="alert" hidden></div>
  <section>
    <h2>mutexes</h2>
    <table id="mutexes">
      <thead>
        <tr><th>mutex</th><th>owner</th><th class="token">token</th>
            <th class="countdown">lease left</th><th>waiting</th></tr>
      </thead>
      <tbody></tbody>
    </table>
    <p id="no-mutexes" class="empty" hidden>The store has no mutexes.</p>
  </section>
  <section>
    <h2>hand-overs seen</h2>
    <ol id="handovers"></ol>
    <p id="no-handovers" class="empty">None since the dashboard started.</p>
  </section>
</main>
<script>
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  let state = null;     // the last answer of /api/state
  let fetchedAt = 0;    // performance.now() when it arrived
  let countdowns = [];  // [cell, mutex] pairs ticked every 100 ms

  // Text only: nothing from the store is ever parsed as HTML.
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function clock(ms) {
    const d = new Date(ms);
    return d.toLocaleTimeString([], { hour12: false }) + "." +
           String(d.getMilliseconds()).padStart(3, "0");
  }

  // The lease left now: the server measured lease_ends_in_ms at its last
  // read, refreshed_ms_ago before answering, and the answer came
  // (performance.now() - fetchedAt) ago.
  function leaseLeft(m) {
    return m.lease_ends_in_ms - state.refreshed_ms_ago - (performance.now() - fetchedAt);
  }
  function tick() {
    for (const [cell, m] of countdowns) {
      if (!m.held) { cell.textContent = "\u2014"; continue; }
      if (m.lease_ends_in_ms === null) { cell.textContent = "unknown"; continue; }
      const left = leaseLeft(m);
      cell.textContent = left > 0 ? (left / 1000).toFixed(1) + " s" : "expired";
      cell.classList.toggle("expired", left <= 0);
    }
  }

  function waitersCell(m) {
    const td = el("td", "waiters");
    if (!state.waiters_supported) {
      td.textContent = "store cannot tell";
      td.classList.add("cannot-tell");
    } else if (m.waiters === null) {
      td.textContent = "unknown";
      td.classList.add("cannot-tell");
    } else if (m.waiters.length === 0) {
      td.textContent = "none";
      td.classList.add("empty");
    } else {
      for (const id of m.waiters) td.append(el("div", "waiter", id));
    }
    return td;
  }

  function renderMutexes() {
    countdowns = [];
    const rows = state.mutexes.map((m) => {
      const tr = el("tr", m.held ? "held" : "free");
      tr.dataset.mutex = m.mutex;
      const countdown = el("td", "countdown");
      countdowns.push([countdown, m]);
      tr.append(el("td", "name", m.mutex), el("td", "owner", m.held ? m.owner : "free"),
                el("td", "token", m.fencing_token ? String(m.fencing_token) : "\u2014"),
                countdown, waitersCell(m));
      return tr;
    });
    $("mutexes").tBodies[0].replaceChildren(...rows);
    $("no-mutexes").hidden = rows.length > 0 || state.refreshed_at_ms === null;
    tick();
  }

  function renderHandovers() {
    const items = state.handovers.map((h) => {
      const li = el("li");
      li.dataset.mutex = h.mutex;
      li.dataset.from = h.from;
      li.dataset.to = h.to;
      li.append(el("span", "at", clock(h.at_ms)), " ", el("span", "name", h.mutex), ": ",
                el("span", "from", h.from || "free"), " \u2192 ", el("span", "to", h.to || "free"));
      if (h.to) li.append(" (token " + h.fencing_token + ")");
      return li;
    });
    $("handovers").replaceChildren(...items);
    $("no-handovers").hidden = items.length > 0;
  }

  function renderHeader() {
    $("store").textContent = state.store;
    $("transport").textContent = state.transport;
    document.title = "simba \u00b7 " + state.store;
    $("refreshed").textContent =
        state.refreshed_at_ms === null ? "never" : clock(state.refreshed_at_ms);
    const banner = $("error");
    banner.hidden = state.error === null;
    if (state.error !== null) {
      banner.textContent = "The store cannot be read: " + state.error + ". " +
          (state.refreshed_at_ms === null ? "No good read yet."
              : "Showing the last good read, from " + clock(state.refreshed_at_ms) + ".");
    }
  }

  async function refresh() {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), 5000);
    try {
      const response = await fetch("api/state", { cache: "no-store", signal: abort.signal });
      if (!response.ok) throw new Error("HTTP " + response.status);
      state = await response.json();
      fetchedAt = performance.now();
      $("offline").hidden = true;
      renderHeader();
      renderMutexes();
      renderHandovers();
    } catch (e) {
      const offline = $("offline");
      offline.textContent = "The dashboard does not answer (" + e.message + "); retrying.";
      offline.hidden = false;
    } finally {
      clearTimeout(timer);
      setTimeout(refresh, 1000);
    }
  }

  refresh();
  setInterval(tick, 100);
})();
</script>
</body>
</html>
)html";

}  // namespace simba::cli

#endif  // SIMBA_TOOLS_CLI_DASHBOARD_PAGE_H_
