// outboxkit console: the only script. Everything works without it; it adds three conveniences.
// 1. Live regions refresh themselves: an element with data-refresh="SECONDS" is fetched again
//    (same URL, header X-Console-Fragment: its id) and replaced, while the tab is visible and the
//    person is not in the middle of a selection or a form.
// 2. "Select all on this page" checks every row's box and shows the count.
// 3. Buttons with data-confirm ask first.
(function () {
  "use strict";
  function busy() {
    var a = document.activeElement;
    if (a && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA")) return true;
    return document.querySelector("input[name=id]:checked") !== null;
  }
  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    var secs = Math.max(1, parseInt(el.getAttribute("data-refresh"), 10) || 10);
    setInterval(function () {
      if (document.visibilityState !== "visible" || busy()) return;
      fetch(location.href, { headers: { "X-Console-Fragment": el.id }, credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) el.innerHTML = html; })
        .catch(function () { /* the next tick tries again */ });
    }, secs * 1000);
  });
  function countSelected() {
    var n = document.querySelectorAll("input[name=id]:checked").length;
    document.querySelectorAll("[data-selected]").forEach(function (s) { s.textContent = n; });
    document.querySelectorAll("[data-needs-selection]").forEach(function (b) { b.disabled = n === 0; });
  }
  document.addEventListener("change", function (e) {
    if (e.target.matches("[data-select-all]")) {
      document.querySelectorAll("input[name=id]").forEach(function (c) { c.checked = e.target.checked; });
    }
    if (e.target.matches("input[name=id], [data-select-all]")) countSelected();
  });
  document.addEventListener("click", function (e) {
    var b = e.target.closest("[data-confirm]");
    if (b && !window.confirm(b.getAttribute("data-confirm"))) e.preventDefault();
  });
  countSelected();
})();
