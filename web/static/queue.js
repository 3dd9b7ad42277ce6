/* RQ pages in the browser.
 *
 * Shared by every page (exported as window.RQ, dashboard.js builds on it):
 * times shown relative to now ("3 s ago", "in 2 min"), confirmation of
 * risky buttons (forms with data-confirm), JSON polling with a live marker.
 * The queue page refreshes its status and per-state lists from q/NAME.json;
 * message pages reload themselves when the message changes state.
 *
 * Data from the server only ever reaches the page through textContent,
 * attributes and createElement, never as markup.
 */
(function () {
  "use strict";

  const body = document.body;
  const ROOT = body.dataset.root || "/";
  // Server clock minus browser clock, so relative times use the server's now.
  const SKEW = body.dataset.now ? Number(body.dataset.now) - Date.now() / 1000 : 0;

  function serverNow() {
    return Date.now() / 1000 + SKEW;
  }

  function queueURL(name) {
    return ROOT + "q/" + encodeURIComponent(name);
  }

  function duration(secs) {
    if (typeof secs !== "number" || !isFinite(secs)) return "–";
    secs = Math.floor(secs);
    const units = [["d", 86400, "h", 3600], ["h", 3600, "min", 60], ["min", 60, "s", 1]];
    for (const [unit, size, sub, subSize] of units) {
      if (secs >= size) {
        const rest = Math.floor((secs % size) / subSize);
        return Math.floor(secs / size) + " " + unit + (rest ? " " + rest + " " + sub : "");
      }
    }
    return secs + " s";
  }

  function relative(epoch) {
    const diff = epoch - serverNow();
    const abs = Math.abs(diff);
    if (abs < 1) return "now";
    let text;
    if (abs < 60) text = Math.round(abs) + " s";
    else if (abs < 3600) text = Math.round(abs / 60) + " min";
    else if (abs < 86400) text = Math.round(abs / 3600) + " h";
    else text = Math.round(abs / 86400) + " d";
    return diff < 0 ? text + " ago" : "in " + text;
  }

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  function clock(epoch) {
    if (typeof epoch !== "number") return "–";
    const d = new Date(epoch * 1000);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  /* The creation time an S4.1 short id encodes (UTC), or null. */
  function idEpoch(id) {
    const m = /^(\d{4})(\d{2})(\d{2})\.(\d{2})(\d{2})\.(\d{2})\.(\d{3})\./.exec(String(id));
    if (!m) return null;
    const n = m.slice(1).map(Number);
    return Date.UTC(n[0], n[1] - 1, n[2], n[3], n[4], n[5], n[6]) / 1000;
  }

  function refreshTimes(scope) {
    (scope || document).querySelectorAll("time.rel[data-epoch]").forEach(function (t) {
      const epoch = Number(t.dataset.epoch);
      if (!t.dataset.epoch || !isFinite(epoch)) return;
      t.textContent = relative(epoch);
      t.title = clock(epoch);
    });
  }

  /* el("a", {href: u, class: "x"}, "text", otherNode): text stays text. */
  function el(tag, attrs) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("data-")) node.dataset[key.slice(5).replace(/-(\w)/g, (_, c) => c.toUpperCase())] = value;
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (let i = 2; i < arguments.length; i++) {
      const child = arguments[i];
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function timeEl(epoch) {
    if (typeof epoch !== "number") return el("span", {class: "muted", text: "–"});
    const t = el("time", {class: "rel", "data-epoch": String(epoch), datetime: String(epoch)});
    t.textContent = relative(epoch);
    t.title = clock(epoch);
    return t;
  }

  /* A one-button POST form; `fields` become hidden inputs. */
  function postForm(action, fields, label, btnClass, confirmText) {
    const form = el("form", {class: "inline", method: "post", action: action,
                             "data-confirm": confirmText || null});
    for (const [name, value] of Object.entries(fields || {})) {
      form.append(el("input", {type: "hidden", name: name, value: value}));
    }
    form.append(el("button", {class: "btn small " + (btnClass || ""), type: "submit", text: label}));
    return form;
  }

  function isURL(text) {
    return typeof text === "string" && /^https?:\/\//i.test(text);
  }

  function setText(id, text) {
    const node = typeof id === "string" ? document.getElementById(id) : id;
    if (node && node.textContent !== String(text)) node.textContent = String(text);
  }

  function setPill(node, status) {
    if (!node) return;
    setText(node, status);
    node.className = "pill st-" + String(status).toLowerCase();
  }

  /* Pause/Resume and Down/Up buttons follow the status (S3.5: DOWN hides the pause flag). */
  function updateToggles(scope, status) {
    const pause = scope.querySelector('[data-op="pause-toggle"]');
    const down = scope.querySelector('[data-op="down-toggle"]');
    const set = function (btn, name, label) {
      if (btn && btn.name !== name) { btn.name = name; btn.value = name; btn.textContent = label; }
    };
    if (status === "PAUSE") set(pause, "resume", "Resume");
    else if (status === "UP" || status === "SCRIPTERROR") set(pause, "pause", "Pause");
    if (status === "DOWN") set(down, "up", "Up");
    else if (["UP", "PAUSE", "SCRIPTERROR"].includes(status)) set(down, "down", "Down");
  }

  function setLive(ok) {
    const live = document.getElementById("live");
    if (!live) return;
    live.classList.toggle("on", ok);
    live.classList.toggle("off", !ok);
    live.textContent = ok ? "live" : "offline";
  }

  async function getJSON(url) {
    const resp = await fetch(url, {cache: "no-store", credentials: "same-origin",
                                   headers: {Accept: "application/json"}});
    if (!resp.ok) throw new Error(url + ": " + resp.status);
    return resp.json();
  }

  /* Run `step` now and then every `ms` (after the previous run finished). */
  function poll(step, ms, quiet) {
    async function tick() {
      let again = true;
      try {
        again = (await step()) !== false;
        if (!quiet) setLive(true);
      } catch (err) {
        if (!quiet) setLive(false);
      }
      if (again) setTimeout(tick, ms);
    }
    tick();
  }

  document.addEventListener("submit", function (event) {
    const text = event.target.dataset && event.target.dataset.confirm;
    if (text && !window.confirm(text)) event.preventDefault();
  }, true);

  // ---------------------------------------------------------------- queue page

  function msgEntry(queue, state, e) {
    const url = queueURL(queue) + "/" + encodeURIComponent(e.msg_id);
    const li = el("li", {class: "msg", "data-id": e.msg_id},
      el("a", {class: "mid", href: url, text: e.msg_id}), " ",
      el("span", {class: "age"}, timeEl(idEpoch(e.msg_id))));
    if (state === "que") {
      if (typeof e.due === "number") li.append(" ", el("span", {class: "due"}, "due ", timeEl(e.due)));
      li.append(el("span", {class: "entry-actions"},
        postForm(url + "/run_now", {}, "Run now"),
        postForm(url, {_method: "delete"}, "Delete", "danger", "Delete message " + e.msg_id + "?")));
    } else if (state === "run") {
      if (e.status) li.append(" ", el("span", {class: "stext", text: e.status}));
      if (typeof e.consumer === "string") {  // pull mode (S8): who holds the lease, until when
        const lease = el("span", {class: "lease"}, "leased by ",
                         el("b", {class: "consumer", text: e.consumer}));
        if (typeof e.lease_expires === "number") lease.append(", expires ", timeEl(e.lease_expires));
        li.append(" ", lease);
      }
      li.append(el("span", {class: "entry-actions"},
        postForm(url, {_method: "destroy"}, "Destroy", "danger",
                 "Destroy running message " + e.msg_id + "? Its job is killed.")));
    } else if (state === "relayed" && e.new_msg) {
      li.append(" ", el("span", {class: "stext"}, "→ ",
        isURL(e.new_msg) ? el("a", {href: e.new_msg, text: e.new_msg}) : e.new_msg));
    }
    return li;
  }

  function updateList(queue, state, entries, size) {
    const section = document.getElementById(state + "-list");
    if (!section || !Array.isArray(entries)) return;
    section.querySelectorAll("[data-size]").forEach((n) => setText(n, size));
    if (state === "relayed" && queue !== "relay" && size > 0) section.hidden = false;
    const sig = JSON.stringify(entries);
    if (section.dataset.sig !== sig) {
      section.dataset.sig = sig;
      const list = section.querySelector("ul.msgs");
      list.replaceChildren(...entries.map((e) => msgEntry(queue, state, e)));
      const more = section.querySelector("p.more");
      if (more) {
        more.hidden = !(size > entries.length);
        more.firstChild.textContent = "showing " + entries.length + " of ";
      }
    }
    section.querySelector("p.empty").hidden = entries.length > 0;
  }

  /* S9.4: the schedule entries' next times follow q/NAME.json. */
  function updateScheduleTimes(entries) {
    if (!Array.isArray(entries)) return;
    document.querySelectorAll("#schedule .sched").forEach(function (div, i) {
      const next = div.querySelector(".next");
      const e = entries[i];
      if (next && e && typeof e.next === "number" && next.dataset.epoch !== String(e.next)) {
        next.dataset.epoch = String(e.next);
        next.replaceChildren("next ", timeEl(e.next));
      }
    });
  }

  function applyQueue(queue, d) {
    setText("q-status", d.status);
    setPill(document.getElementById("queue-status"), d.status);
    const banner = document.getElementById("down-banner");
    if (d.status === "DOWN" && !banner.firstChild) {
      banner.append(el("p", {class: "banner down", text: "Queue is HARD DOWN"}));
    } else if (d.status !== "DOWN") {
      banner.replaceChildren();
    }
    updateToggles(document, d.status);
    if (d.status === "DOWN") return;  // S15.3: nothing else is sent
    setText("q-ping", d.ping || "–");
    setText("q-pid", d.pid || "–");
    setText("q-uptime", duration(d.uptime));
    updateScheduleTimes(d.schedule);
    if (!d.messages) return;
    for (const state of Object.keys(d.messages)) {
      updateList(queue, state, d.messages[state], d[state + "_size"]);
    }
  }

  function initQueuePage() {
    const queue = body.dataset.queue;
    const url = body.dataset.jsonUrl + "?limit=" + encodeURIComponent(body.dataset.limit || "100");
    poll(async function () { applyQueue(queue, await getJSON(url)); }, 1000);
  }

  // ---------------------------------------------------------------- message pages

  /* A flash shown just before the page reloads itself stays on the reloaded page. */
  const KEPT_FLASH = "rq-kept-flash";

  function keepFlash() {
    const items = [...document.querySelectorAll("ul.flash li")].map((li) => li.textContent);
    if (items.length) {
      sessionStorage.setItem(KEPT_FLASH, JSON.stringify({url: location.href, items: items}));
    }
  }

  function restoreFlash() {
    const kept = sessionStorage.getItem(KEPT_FLASH);
    sessionStorage.removeItem(KEPT_FLASH);
    if (!kept || document.querySelector("ul.flash")) return;
    const data = JSON.parse(kept);
    if (data.url !== location.href) return;
    const list = el("ul", {class: "flash"}, ...data.items.map((t) => el("li", {text: t})));
    document.querySelector("main").prepend(list);
  }

  function initMessagePage() {
    restoreFlash();
    const shown = body.dataset.state;
    if (!["prep", "que", "run"].includes(shown)) return;
    poll(async function () {
      const reply = await getJSON(body.dataset.stateUrl);
      if (Array.isArray(reply) && reply[0] !== shown && reply[0] !== "fail") {
        keepFlash();
        window.location.reload();
        return false;
      }
      return true;
    }, 1500, true);
  }

  window.RQ = {ROOT, el, timeEl, postForm, relative, duration, clock, queueURL, getJSON,
               poll, setText, setPill, updateToggles, refreshTimes, setLive, isURL};

  refreshTimes();
  setInterval(refreshTimes, 1000);
  if (body.dataset.page === "queue") initQueuePage();
  if (body.dataset.page === "message") initMessagePage();
})();
