/* OpenOnce console: the little the pages need beyond htmx, with no inline script (the
   Content-Security-Policy allows script from this origin's files only).

   - times: every <time datetime> is shown in the viewer's zone, UTC kept on hover;
   - the queue: polls never disturb the operator. The table is morphed in place
     (idiomorph, hx-swap="morph:outerHTML"): rows keep their elements and unchanged text
     keeps its nodes, so focus and a text selection stay where they were; the tab title
     carries the count (data-title);
   - keys: j / k move between rows, Enter opens one, / searches, g q goes to the queue,
     ? shows the help;
   - copy buttons (data-copy) and receipt templates (data-fill). */
(function () {
  "use strict";

  var zoneFormat = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
    hour12: false, timeZoneName: "short"
  });

  function localizeTimes(root) {
    var times = (root || document).querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var el = times[i];
      var moment = new Date(el.getAttribute("datetime"));
      if (isNaN(moment.getTime())) continue;
      var local = zoneFormat.format(moment);
      if (el.textContent !== local) el.textContent = local;
      el.classList.add("local");
    }
  }

  function syncTitle(root) {
    var holder = root && root.closest ? root.closest("[data-title]") : null;
    holder = holder || document.querySelector("[data-title]");
    if (holder && document.title !== holder.dataset.title) document.title = holder.dataset.title;
  }

  document.addEventListener("htmx:afterSettle", function (evt) {
    localizeTimes(evt.detail.elt);
    syncTitle(evt.detail.elt);
  });

  // -- keys ------------------------------------------------------------------------------

  function typing(target) {
    if (!target || !target.tagName) return false;
    var tag = target.tagName.toLowerCase();
    return tag === "input" || tag === "textarea" || tag === "select" || target.isContentEditable;
  }

  function rowLinks() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-row] a[data-row-link]"));
  }

  function moveRow(step) {
    var links = rowLinks();
    if (!links.length) return;
    var current = -1;
    var active = document.activeElement;
    for (var i = 0; i < links.length; i++) {
      if (links[i] === active || links[i].closest("[data-row]").contains(active)) current = i;
    }
    var next = current === -1 ? (step > 0 ? 0 : links.length - 1) : current + step;
    next = Math.max(0, Math.min(links.length - 1, next));
    links[next].focus();
    links[next].closest("[data-row]").scrollIntoView({ block: "nearest" });
  }

  var pendingG = false;
  document.addEventListener("keydown", function (evt) {
    if (evt.defaultPrevented || evt.ctrlKey || evt.metaKey || evt.altKey) return;
    if (typing(evt.target)) return;
    var help = document.getElementById("keys-help");
    if (help && help.open) return; // the dialog handles Esc itself
    if (pendingG) {
      pendingG = false;
      if (evt.key === "q") { window.location.href = "/"; evt.preventDefault(); }
      return;
    }
    if (evt.key === "j") { moveRow(1); evt.preventDefault(); }
    else if (evt.key === "k") { moveRow(-1); evt.preventDefault(); }
    else if (evt.key === "/") {
      var box = document.getElementById("site-search");
      if (box) { box.focus(); box.select(); evt.preventDefault(); }
    } else if (evt.key === "?") {
      if (help && help.showModal) { help.showModal(); evt.preventDefault(); }
    } else if (evt.key === "g") { pendingG = true; }
  });

  // -- copy and fill ---------------------------------------------------------------------

  function say(button, text) {
    var label = button.dataset.label || button.textContent;
    button.dataset.label = label;
    button.textContent = text;
    window.setTimeout(function () { button.textContent = label; }, 1500);
  }

  function copyText(text, button) {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { say(button, "Copied"); },
        function () { say(button, "Copy failed"); }
      );
      return;
    }
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    say(button, ok ? "Copied" : "Press Ctrl+C");
  }

  document.addEventListener("click", function (evt) {
    var copy = evt.target.closest("button[data-copy]");
    if (copy) { copyText(copy.dataset.copy, copy); return; }
    var fill = evt.target.closest("button[data-fill]");
    if (fill) {
      var source = document.getElementById(fill.dataset.fill);
      var target = document.getElementById(fill.dataset.target);
      if (source && target) {
        target.value = source.textContent;
        target.focus();
      }
    }
  });

  function start() {
    localizeTimes(document);
    syncTitle(null);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
