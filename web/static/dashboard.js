/* The dashboard (S16.1) kept live: the manager line, queue rows and totals
 * from q.json every 1.5 s (new queues appear, deleted ones go), schedule
 * "next" times from q/NAME.json and the Timer List from timers.json.
 * New rows are cloned from the server-rendered <template>; data only ever
 * goes in through textContent and attributes.  Needs queue.js (window.RQ).
 */
(function () {
  "use strict";

  const RQ = window.RQ;
  const body = document.body;
  // S3.8: the builtin names come from the server (web/backend.py BUILTIN, the one
  // copy), so a live-added `analytics` row lands among the builtin queues (issue 16).
  const BUILTIN = (document.getElementById("builtin-queues").dataset.names || "").split(" ");
  const STATES = ["prep", "que", "run", "err", "done", "relayed"];
  const template = document.getElementById("queue-row-template");
  const rows = new Map();
  document.querySelectorAll("#queue-list tr.queue-row[data-queue]").forEach(function (row) {
    rows.set(row.dataset.queue, row);
  });

  // ---------------------------------------------------------------- manager line

  function applyManager(d) {
    const status = document.getElementById("status");
    RQ.setText(status, d.status);
    status.className = d.status === "OPERATIONAL" ? "green" : "red";
    RQ.setText("ping", d.ping || "–");
    RQ.setText("pid", d.pid || "–");
    RQ.setText("uptime", RQ.duration(d.uptime));
    RQ.setText("time", RQ.clock(d.time));
    const version = document.getElementById("version");
    const web = body.dataset.webVersion;
    const same = d.version === web;
    RQ.setText(version, same ? d.version : d.version + " ≠ web " + web);
    version.className = same ? "" : "red";
  }

  // ---------------------------------------------------------------- queue rows

  function insertSorted(tbody, row, name) {
    for (const other of tbody.querySelectorAll("tr.queue-row")) {
      if (other.dataset.queue > name) {
        tbody.insertBefore(row, other);
        return;
      }
    }
    tbody.append(row);
  }

  function addRow(name) {
    const row = template.content.querySelector("tr").cloneNode(true);
    const base = RQ.queueURL(name);
    row.dataset.queue = name;
    const link = row.querySelector("td.name a");
    link.href = base;
    link.textContent = name;
    row.querySelectorAll("form[data-suffix]").forEach(function (form) {
      form.action = base + "/" + form.dataset.suffix;
    });
    const tbody = document.getElementById(BUILTIN.includes(name) ? "builtin-queues" : "custom-queues");
    insertSorted(tbody, row, name);
    rows.set(name, row);
    loadSchedule(name, row);
    return row;
  }

  function setCount(cell, value) {
    if (!cell || cell.textContent === String(value)) return;
    cell.textContent = String(value);
    cell.classList.toggle("zero", !value);
    cell.classList.remove("changed");
    void cell.offsetWidth;  // restart the highlight animation
    cell.classList.add("changed");
  }

  function updateRow(row, q) {
    const cell = (k) => row.querySelector('[data-k="' + k + '"]');
    RQ.setPill(cell("status"), q.status);
    for (const s of STATES) setCount(cell(s), (q.counts || {})[s] || 0);
    RQ.setText(cell("ping"), q.ping || "–");
    RQ.setText(cell("pid"), q.pid || "–");
    RQ.setText(cell("uptime"), RQ.duration(q.uptime));
    RQ.updateToggles(row, q.status);
  }

  function applyTotals(queues) {
    for (const s of STATES) {
      const total = queues.reduce((n, q) => n + ((q.counts || {})[s] || 0), 0);
      const node = document.querySelector('[data-total="' + s + '"]');
      if (node) RQ.setText(node, total);
    }
  }

  function applyQueues(queues) {
    const seen = new Set();
    for (const q of queues) {
      seen.add(q.name);
      updateRow(rows.get(q.name) || addRow(q.name), q);
    }
    rows.forEach(function (row, name) {
      if (!seen.has(name)) {
        row.remove();
        rows.delete(name);
      }
    });
    applyTotals(queues);
  }

  // ---------------------------------------------------------------- schedules

  function scheduleEntry(name, entry) {
    const params = {};
    for (let i = 1; i <= 4; i++) {
      const v = entry["param" + i];
      if (v !== undefined && v !== null) params["param" + i] = String(v);
    }
    const fields = {x_format: "html", back: RQ.ROOT, "mesg[dest]": name, "mesg[src]": "cron-now"};
    const div = RQ.el("div", {class: "sched"},
      RQ.el("code", {class: "cron", title: entry.tz || "server time zone", text: entry.cron}));
    for (const [k, v] of Object.entries(params)) {
      fields["mesg[" + k + "]"] = v;
      div.append(" ", RQ.el("span", {class: "param", text: k + "=" + v}));
    }
    div.append(" ", RQ.el("span", {class: "next"}, "next ", RQ.timeEl(entry.next)), " ",
               RQ.postForm(RQ.queueURL(name) + "/new_message", fields, "Run Now"));
    return div;
  }

  /* A row added live learns its schedule from q/NAME.json (S9.4), once the
   * queue process answers. */
  async function loadSchedule(name, row, tries) {
    tries = tries || 0;
    try {
      const d = await RQ.getJSON(RQ.queueURL(name) + ".json?limit=1");
      if (!Array.isArray(d.schedule)) throw new Error("not running yet");
      row.querySelector('[data-k="schedule"]').replaceChildren(
        ...d.schedule.map((e) => scheduleEntry(name, e)));
    } catch (err) {
      if (tries < 10 && rows.get(name) === row) {
        setTimeout(function () { loadSchedule(name, row, tries + 1); }, 2000);
      }
    }
  }

  async function refreshNext(name, row) {
    const d = await RQ.getJSON(RQ.queueURL(name) + ".json?limit=1");
    const entries = Array.isArray(d.schedule) ? d.schedule : [];
    row.querySelectorAll(".sched").forEach(function (div, i) {
      const next = div.querySelector(".next");
      if (entries[i] && typeof entries[i].next === "number") {
        next.replaceChildren("next ", RQ.timeEl(entries[i].next));
      }
    });
  }

  function refreshSchedules() {
    rows.forEach(function (row, name) {
      if (row.querySelector(".sched")) refreshNext(name, row).catch(function () {});
    });
  }

  // ---------------------------------------------------------------- timers

  function applyTimers(d) {
    const tbody = document.querySelector("#timers tbody");
    const timers = Array.isArray(d.timers) ? d.timers : [];
    if (!timers.length) {
      tbody.replaceChildren(RQ.el("tr", {class: "empty"}, RQ.el("td", {colspan: "4", text: "No timers."})));
    } else {
      tbody.replaceChildren(...timers.map((t) => RQ.el("tr", {},
        RQ.el("td", {text: t.name}),
        RQ.el("td", {text: t.dest || "–"}),
        RQ.el("td", {class: "num", text: RQ.duration(t.period)}),
        RQ.el("td", {}, RQ.timeEl(t.due)))));
    }
    if (typeof d.sent === "number") {
      RQ.setText("timer-stats", "sent " + d.sent + " · errors " + (d.errors || 0));
    }
  }

  // ---------------------------------------------------------------- polling

  RQ.poll(async function () {
    let d;
    try {
      d = await RQ.getJSON(RQ.ROOT + "q.json");
    } catch (err) {  // 503 while the manager is down (S14.6), or the server is gone
      const status = document.getElementById("status");
      RQ.setText(status, "NOT RESPONDING");
      status.className = "red";
      throw err;
    }
    applyManager(d);
    if (Array.isArray(d.queues)) applyQueues(d.queues);
  }, 1500);
  RQ.poll(async function () { applyTimers(await RQ.getJSON(RQ.ROOT + "timers.json")); }, 5000, true);
  setTimeout(function () { RQ.poll(async function () { refreshSchedules(); }, 20000, true); }, 20000);
})();
