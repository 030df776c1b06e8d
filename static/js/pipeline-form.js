// The pipeline form: show only the chosen restart policy's and sink's fields (without
// JavaScript, all are shown, and the server uses the chosen sink's). A file of its own, not
// inline: the Content-Security-Policy allows no inline script.
(function () {
  "use strict";
  function toggle(selectId, selector, attribute) {
    const select = document.getElementById(selectId);
    if (!select) return;
    function show() {
      document.querySelectorAll(selector).forEach(function (el) {
        el.hidden = el.dataset[attribute] !== select.value;
      });
    }
    select.addEventListener("change", show);
    show();
  }
  toggle("f-restart_kind", ".rp-group", "group");
  toggle("f-sink_kind", ".sink-group", "sink");
})();
