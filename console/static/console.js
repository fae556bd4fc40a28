// The overview refreshes its figures in place every data-refresh ms,
// fetching the page's main part only. Nothing else runs here.
(function () {
  "use strict";
  var every = Number(document.body.dataset.refresh || 0);
  if (!every) {
    return;
  }
  var main = document.getElementById("main");
  function refresh() {
    fetch(window.location.href, { headers: { "X-Console-Fragment": "1" }, credentials: "same-origin" })
      .then(function (resp) { return resp.ok ? resp.text() : null; })
      .then(function (html) {
        if (html !== null) {
          main.innerHTML = html;
          document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
        }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(refresh, every);
})();
