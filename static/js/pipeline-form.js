// The pipeline form: show only the chosen restart policy's fields (without JavaScript, all
// are shown). A file of its own, not inline: the Content-Security-Policy allows no inline script.
(function () {
  "use strict";
  const select = document.getElementById("f-restart_kind");
  if (!select) return;
  function show() {
    document.querySelectorAll(".rp-group").forEach(function (el) {
      el.hidden = el.dataset.group !== select.value;
    });
  }
  select.addEventListener("change", show);
  show();
})();
