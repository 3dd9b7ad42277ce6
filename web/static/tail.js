/* Tail view (SPEC S16.6): follows a growing file and renders it in the browser.
 *
 * The server sends raw bytes; everything here is client side.  Two parts:
 *  - pure rendering, exported as window.RQTail (and module.exports under node) so tests can
 *    call it without a page:
 *      RQTail.escapeHtml(text)            -> text with & < > " ' escaped
 *      RQTail.renderLine(line, style)     -> {html, style}: one line; ANSI SGR colours become
 *                                            <span class="ansi-...">, URLs become links,
 *                                            every piece of text HTML-escaped
 *      RQTail.render(text)                -> html of a whole text, lines joined with "\n"
 *      new RQTail.Renderer().feed(text)   -> {lines: [html...], partial: html or null}; the
 *                                            trailing partial line is re-rendered on every feed
 *                                            and becomes a line once its "\n" arrives;
 *                                            .finish() -> the same, flushing the partial line
 *      RQTail.parseContentRange(header)   -> {first, last, size} or null
 *  - the follower (RQTail.follow(section)), started for the #tail element of tailview.html: it
 *    polls data-src with "Range: bytes=<offset>-" and Cache-Control: no-cache, appends each 206
 *    chunk and polls again after 100 ms; on any other status it asks data-state-url after 1 s,
 *    keeps polling every second while the message is in prep, que or run, and once it has left
 *    them makes one last round and stops.
 * Only text that went through escapeHtml is ever assigned to innerHTML.
 */
(function (global) {
  "use strict";

  var ACTIVE_STATES = ["prep", "que", "run"];
  var ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;"};
  // CSI sequences (SGR is the one ending in "m"), OSC sequences (titles, hyperlinks), other
  // two-byte escapes, a lone ESC, CR, and the C0 controls other than TAB and LF.
  var CONTROL_RE = new RegExp(
    "\\x1b\\[([0-9;:?<=>]*)[ -/]*([@-~])|\\x1b\\][^\\x07\\x1b]*(?:\\x07|\\x1b\\\\|$)" +
    "|\\x1b[@-_]?|\\r|[\\x00-\\x08\\x0b-\\x1f\\x7f]", "g");
  var URL_RE = /https?:\/\/[^\s<>"'`\x00-\x1f\x7f]+/g;
  var TRAILING_PUNCT_RE = /[.,;:!?'")\]}]+$/;

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, function (c) { return ESCAPES[c]; });
  }

  function plainStyle() {
    return {fg: null, bg: null, bold: false};
  }

  function copyStyle(style) {
    return {fg: style.fg, bg: style.bg, bold: style.bold};
  }

  // One SGR parameter list ("1;31", "" = reset) applied to a copy of `style`.
  function applySgr(style, params) {
    var out = copyStyle(style);
    var codes = params === "" ? ["0"] : params.split(/[;:]/);
    for (var i = 0; i < codes.length; i++) {
      var code = codes[i] === "" ? 0 : parseInt(codes[i], 10);
      if (code === 0) {
        out = plainStyle();
      } else if (code === 1) {
        out.bold = true;
      } else if (code === 21 || code === 22) {
        out.bold = false;
      } else if ((code >= 30 && code <= 37) || (code >= 90 && code <= 97)) {
        out.fg = code;
      } else if (code === 39) {
        out.fg = null;
      } else if ((code >= 40 && code <= 47) || (code >= 100 && code <= 107)) {
        out.bg = code;
      } else if (code === 49) {
        out.bg = null;
      } else if (code === 38 || code === 48) {  // 256-colour and RGB forms: skipped
        i += codes[i + 1] === "5" ? 2 : codes[i + 1] === "2" ? 4 : 0;
      }
    }
    return out;
  }

  function styleClass(style) {
    var names = [];
    if (style.bold) { names.push("ansi-bold"); }
    if (style.fg !== null) { names.push("ansi-fg-" + style.fg); }
    if (style.bg !== null) { names.push("ansi-bg-" + style.bg); }
    return names.join(" ");  // only fixed words and numbers: safe in an attribute
  }

  // Escaped text with http(s) URLs as links.
  function linkify(text) {
    var html = "";
    var last = 0;
    text.replace(URL_RE, function (match, index) {
      var url = match.replace(TRAILING_PUNCT_RE, "");
      if (url.length < match.length && match.charAt(url.length) === ")" &&
          url.indexOf("(") >= 0) {
        url += ")";  // keep a closing parenthesis that belongs to the URL
      }
      html += escapeHtml(text.slice(last, index)) + "<a href=\"" + escapeHtml(url) +
        "\" rel=\"noopener noreferrer\" target=\"_blank\">" + escapeHtml(url) + "</a>";
      last = index + url.length;
      return match;
    });
    return html + escapeHtml(text.slice(last));
  }

  // One line (no "\n"), starting in `style`; returns its html and the style after it.
  function renderLine(line, style) {
    var current = style ? copyStyle(style) : plainStyle();
    var pieces = [];
    var overwrite = false;  // after a carriage return, the next text replaces the line so far
    var add = function (text) {
      if (text === "") { return; }
      if (overwrite) { pieces = []; overwrite = false; }
      pieces.push({style: current, text: text});
    };
    var last = 0;
    var match;
    CONTROL_RE.lastIndex = 0;
    while ((match = CONTROL_RE.exec(line)) !== null) {
      add(line.slice(last, match.index));
      last = CONTROL_RE.lastIndex;
      if (match[0].charAt(1) === "[" && match[2] === "m" && !/[?<=>]/.test(match[1])) {
        current = applySgr(current, match[1]);
      } else if (match[0] === "\r") {
        overwrite = true;
      }
    }
    add(line.slice(last));
    var html = "";
    for (var i = 0; i < pieces.length; i++) {
      var cls = styleClass(pieces[i].style);
      var inner = linkify(pieces[i].text);
      html += cls ? "<span class=\"" + cls + "\">" + inner + "</span>" : inner;
    }
    return {html: html, style: current};
  }

  function render(text) {
    var style = plainStyle();
    var lines = String(text).split("\n");
    var out = [];
    for (var i = 0; i < lines.length; i++) {
      var r = renderLine(lines[i], style);
      style = r.style;
      out.push(r.html);
    }
    return out.join("\n");
  }

  // Incremental rendering of a stream of text: complete lines once, the partial line again
  // on every feed (so it is shown at once and replaced when its end arrives).
  function Renderer() {
    this.style = plainStyle();
    this.pending = "";
    this.count = 0;
  }

  Renderer.prototype.feed = function (text) {
    var parts = (this.pending + text).split("\n");
    this.pending = parts.pop();
    var lines = [];
    for (var i = 0; i < parts.length; i++) {
      var r = renderLine(parts[i], this.style);
      this.style = r.style;
      lines.push(r.html);
    }
    this.count += lines.length;
    var partial = this.pending === "" ? null : renderLine(this.pending, this.style).html;
    return {lines: lines, partial: partial};
  };

  Renderer.prototype.finish = function () {
    var result = this.feed("");
    if (this.pending !== "") {
      result.lines.push(result.partial);
      result.partial = null;
      this.pending = "";
      this.count += 1;
    }
    return result;
  };

  function parseContentRange(header) {
    var m = /^\s*bytes\s+(\d+)-(\d+)\/(\d+|\*)\s*$/i.exec(header || "");
    if (!m) { return null; }
    return {first: parseInt(m[1], 10), last: parseInt(m[2], 10),
            size: m[3] === "*" ? null : parseInt(m[3], 10)};
  }

  // ------------------------------------------------------------ the page

  function LogView(section) {
    this.log = section.querySelector(".tail-log");
    this.follow = section.querySelector("#tail-scroll");
    this.position = section.querySelector("#tail-pos");
    this.statusEl = section.querySelector("#tail-status");
    this.partialEl = null;
    this.lineCount = 0;
    var view = this;
    this.log.addEventListener("scroll", function () { view.showPosition(); });
    global.addEventListener("resize", function () { view.showPosition(); });
    if (this.follow) {
      this.follow.addEventListener("change", function () { view.scroll(); });
    }
  }

  LogView.prototype.lineElement = function (html) {
    var el = global.document.createElement("div");
    el.className = "tail-line";
    el.innerHTML = html;  // built by renderLine: every text piece escaped
    return el;
  };

  LogView.prototype.show = function (result) {
    for (var i = 0; i < result.lines.length; i++) {
      this.log.insertBefore(this.lineElement(result.lines[i]), this.partialEl);
      this.lineCount += 1;
    }
    if (this.partialEl) {
      this.log.removeChild(this.partialEl);
      this.partialEl = null;
    }
    if (result.partial !== null) {
      this.partialEl = this.lineElement(result.partial);
      this.partialEl.className += " tail-partial";
      this.log.appendChild(this.partialEl);
    }
    this.scroll();
  };

  LogView.prototype.scroll = function () {
    if (this.follow && this.follow.checked) { this.log.scrollTop = this.log.scrollHeight; }
    this.showPosition();
  };

  // "Line N / M": N = the last line visible in the view, found by bisection on offsets.
  LogView.prototype.showPosition = function () {
    var lines = this.log.children;
    var total = lines.length;
    var bottom = this.log.scrollTop + this.log.clientHeight;
    var lo = 0;
    var hi = total;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (lines[mid].offsetTop - this.log.offsetTop < bottom) { lo = mid + 1; } else { hi = mid; }
    }
    if (this.position) { this.position.textContent = "Line " + lo + " / " + total; }
  };

  LogView.prototype.status = function (text) {
    if (this.statusEl) { this.statusEl.textContent = text; }
  };

  // Range polling with the S16.6 stop rule.
  function follow(section) {
    var src = section.getAttribute("data-src");
    var stateUrl = section.getAttribute("data-state-url");
    var view = new LogView(section);
    var renderer = new Renderer();
    var decoder = new global.TextDecoder("utf-8");  // invalid bytes become U+FFFD
    var offset = 0;
    var lastRound = false;

    function poll() {
      global.fetch(src, {headers: {"Range": "bytes=" + offset + "-", "Cache-Control": "no-cache"},
                         cache: "no-store", credentials: "same-origin"})
        .then(function (resp) {
          if (resp.status !== 206) { return atEnd(resp.status); }
          var range = parseContentRange(resp.headers.get("Content-Range"));
          return resp.arrayBuffer().then(function (buffer) {
            view.show(renderer.feed(decoder.decode(new Uint8Array(buffer), {stream: true})));
            offset = range ? range.last + 1 : offset + buffer.byteLength;
            if (!lastRound) { view.status("following"); }
            global.setTimeout(poll, 100);
          });
        })
        .catch(function () { atEnd(0); });
    }

    function atEnd(status) {
      if (lastRound) {
        view.show(renderer.feed(decoder.decode()));
        view.show(renderer.finish());
        return;
      }
      if (status !== 416) { view.status(status ? "waiting (" + status + ")" : "waiting"); }
      global.setTimeout(checkState, 1000);
    }

    function checkState() {
      global.fetch(stateUrl, {cache: "no-store", credentials: "same-origin",
                              headers: {"Accept": "application/json"}})
        .then(function (resp) {
          if (resp.status === 404) { return ["deleted"]; }
          return resp.ok ? resp.json() : null;
        })
        .then(function (reply) {
          var state = reply && typeof reply[0] === "string" ? reply[0] : null;
          if (state !== null && ACTIVE_STATES.indexOf(state) < 0) {
            lastRound = true;
            view.status("ended: " + state);
          } else if (state !== null) {
            view.status(state);
          }
          poll();
        })
        .catch(function () { poll(); });
    }

    poll();
  }

  var api = {
    escapeHtml: escapeHtml,
    applySgr: applySgr,
    renderLine: renderLine,
    render: render,
    Renderer: Renderer,
    parseContentRange: parseContentRange,
    follow: follow,
    ACTIVE_STATES: ACTIVE_STATES
  };
  global.RQTail = api;
  if (typeof module === "object" && module.exports) { module.exports = api; }

  if (global.document) {
    var start = function () {
      var section = global.document.getElementById("tail");
      if (section) { follow(section); }
    };
    if (global.document.readyState === "loading") {
      global.document.addEventListener("DOMContentLoaded", start);
    } else {
      start();
    }
  }
})(typeof window !== "undefined" ? window : globalThis);
