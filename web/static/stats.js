/* The Stats pages (web/stats.py) in the browser, on top of window.RQ (queue.js).
 *
 * The page is complete without this script: its charts are server-side SVG and
 * queue.js already shows the run's time relative to now.  This script only
 * watches stats.json and, once a newer analytics run has been published (for
 * instance after "Run analytics now"), shows a link that reloads the page.
 * Nothing from the server reaches the page as markup.
 */
(function () {
  "use strict";

  const RQ = window.RQ;
  const body = document.body;
  const POLL_MS = 5000;

  function watchForNewResult() {
    const shown = body.dataset.runId || "";
    const notice = document.getElementById("new-result");
    if (!RQ || !notice || !body.dataset.statsUrl) return;
    RQ.poll(async function () {
      const summary = await RQ.getJSON(body.dataset.statsUrl);
      const runId = summary && typeof summary.run_id === "string" ? summary.run_id : "";
      if (runId && runId !== shown) {
        notice.hidden = false;
        notice.classList.add("on");
        return false;  // one notice is enough
      }
      return true;
    }, POLL_MS, true);
  }

  if (body.dataset.page === "stats") watchForNewResult();
})();
