/* OpenOnce console: the little the pages need beyond htmx, with no inline script (the
   Content-Security-Policy allows script from this origin's files only).

   - times are rendered in UTC by the server, as the filters read them: nothing to do here;
   - the queue: polls never disturb the operator. The table is morphed in place
     (idiomorph, hx-swap="morph:outerHTML"): rows keep their elements and unchanged text
     keeps its nodes, so focus and a text selection stay where they were; the tab title
     carries the count (data-title);
   - keys: j / k move between rows, Enter opens one, / searches, g q goes to the queue,
     ? shows the help;
   - copy buttons (data-copy) and receipt templates (data-fill);
   - an effect's page after a decision: the title follows its state (data-title), the
     focus goes to the result (data-focus) instead of falling to <body>; while it is open
     the page asks every 5 s whether the effect moved on and shows it as it is now, unless
     something was typed into a decision form: then it only says so, with a reload link. */
(function () {
  "use strict";

  function syncTitle(root) {
    // A swapped-out element still carries the old title: read the page as it is now.
    if (root && !document.contains(root)) root = null;
    var holder = root && root.closest ? root.closest("[data-title]") : null;
    holder = holder || document.querySelector("[data-title]");
    if (holder && document.title !== holder.dataset.title) document.title = holder.dataset.title;
  }

  function focusResult() {
    var target = document.querySelector("[data-focus]");
    if (!target) return;
    target.removeAttribute("data-focus");
    target.focus();
  }

  document.addEventListener("htmx:afterSettle", function (evt) {
    syncTitle(evt.detail.elt);
    focusResult();
  });

  // -- an effect that moved on while its page was open ------------------------------------

  function typedInto(root) {
    if (!root) return false;
    var fields = root.querySelectorAll("form.action input, form.action textarea");
    for (var i = 0; i < fields.length; i++) {
      var field = fields[i];
      if (field.type === "hidden") continue;
      if (field.type === "checkbox" || field.type === "radio") {
        if (field.checked !== field.defaultChecked) return true;
      } else if (field.value !== field.defaultValue) {
        return true;
      }
    }
    return false;
  }

  document.addEventListener("htmx:beforeSwap", function (evt) {
    var source = evt.detail.requestConfig && evt.detail.requestConfig.elt;
    if (!source || !source.hasAttribute || !source.hasAttribute("data-effect-poll")) return;
    if (evt.detail.xhr.status !== 200 || !typedInto(document.getElementById("effect"))) return;
    // Keep what the person typed: say the effect changed, with the way to its page.
    evt.detail.shouldSwap = false;
    var changed = document.getElementById("effect-changed");
    if (changed) changed.hidden = false;
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
    syncTitle(null);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
