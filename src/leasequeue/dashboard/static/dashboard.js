// leasequeue dashboard: the one script, served by the dashboard itself (no build step).
// A form with data-confirm asks before it is sent; the question is read as
// text (dataset), so a group id in it is never markup.
"use strict";
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form && form.dataset ? form.dataset.confirm : null;
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
