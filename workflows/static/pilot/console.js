/* PILOT operator console: live updates, ticking clocks, the trigger form's
   example payloads and the filter-wide actions' progress. Plain browser
   JavaScript: no library, no CDN, no build step. Every page works without it
   (reload to refresh; "Continue" runs the next chunk). */
"use strict";
(function () {
  var INTERVAL_MS = 2000;
  var skew = 0; // server clock minus browser clock, in ms

  /* Mirrors workflows/admin/text.py seconds_text. */
  function fmt(seconds) {
    seconds = Math.max(seconds, 0);
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    if (seconds < 10) return seconds.toFixed(1) + " s";
    if (seconds < 60) return Math.round(seconds) + " s";
    var s = Math.floor(seconds), m = Math.floor(s / 60);
    if (m < 60) return m + " min " + (s % 60) + " s";
    var h = Math.floor(m / 60);
    if (h < 24) return h + " h " + (m % 60) + " min";
    return Math.floor(h / 24) + " d " + (h % 24) + " h";
  }

  /* [data-since="<ISO time>"] shows the time since then, every second. */
  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll("[data-since]").forEach(function (el) {
      var since = Date.parse(el.getAttribute("data-since"));
      if (!isNaN(since)) el.textContent = fmt((now - since) / 1000);
    });
  }

  function stored(key) {
    try { return window.localStorage.getItem(key); } catch (e) { return null; }
  }

  function store(key, value) {
    try { window.localStorage.setItem(key, value); } catch (e) { /* private mode */ }
  }

  /* The page's live part(s): fetch the JSON endpoint, swap the fragments in. */
  function live() {
    var box = document.getElementById("pilot-live");
    if (!box) return;
    var toggle = document.getElementById("pilot-live-toggle");
    var status = document.getElementById("pilot-live-status");
    var key = "pilot-live:" + box.getAttribute("data-live-key");
    var timer = null;
    var saved = stored(key);
    toggle.checked = saved ? saved === "on" : box.getAttribute("data-live-default") === "on";
    var serverNow = Date.parse(box.getAttribute("data-now"));
    if (!isNaN(serverNow)) skew = serverNow - Date.now();

    function schedule() {
      clearTimeout(timer);
      if (toggle.checked) timer = setTimeout(refresh, INTERVAL_MS);
    }

    var rowsUnbound = false;

    function swap(fragments) {
      Object.keys(fragments).forEach(function (id) {
        var el = document.getElementById(id);
        if (el) el.outerHTML = fragments[id];
      });
      if (fragments["pilot-results"]) rowsUnbound = true;
    }

    /* New list rows are unknown to Django's action script (select all, the
       counter). Introduce them once, when the operator reaches for the list
       (before the click or key lands), not at every refresh. */
    function bindRows() {
      var boxes = document.querySelectorAll("tr input.action-select");
      if (rowsUnbound && boxes.length && window.Actions) {
        document.querySelectorAll(".action-counter").forEach(function (counter) {
          counter.setAttribute("data-actions-icnt", boxes.length);
        });
        window.Actions(boxes);
      }
      rowsUnbound = false;
    }
    document.addEventListener("pointerdown", function (event) {
      if (event.target.closest && event.target.closest("#pilot-results")) bindRows();
    }, true);
    document.addEventListener("focusin", function (event) {
      if (event.target.closest && event.target.closest("#pilot-results")) bindRows();
    }, true);

    function refresh() {
      if (document.hidden) return schedule();
      if (document.querySelector("#result_list input.action-select:checked, #action-toggle:checked")) {
        status.textContent = "paused while tasks are selected";
        return schedule();
      }
      fetch(box.getAttribute("data-live-url"), {
        credentials: "same-origin", headers: {"Accept": "application/json"}
      }).then(function (response) {
        return response.json().then(function (data) {
          if (!response.ok) throw new Error(data.error || ("HTTP " + response.status));
          return data;
        });
      }).then(function (data) {
        skew = Date.parse(data.now) - Date.now();
        var was = box.getAttribute("data-live-state");
        if (was && data.state && data.state !== was) {
          location.reload(); // a new state: buttons, result and details change too
          return;
        }
        swap(data.fragments);
        status.textContent = "updated " + new Date(Date.now() + skew).toISOString().slice(11, 19)
          + " UTC";
        tick();
        if (data.finished) {
          status.textContent += "; finished, so no more updates";
          return;
        }
        schedule();
      }).catch(function (error) {
        status.textContent = "not updated (" + error.message + "); trying again";
        schedule();
      });
    }

    toggle.addEventListener("change", function () {
      store(key, toggle.checked ? "on" : "off");
      if (toggle.checked) {
        refresh();
      } else {
        clearTimeout(timer);
        status.textContent = "paused";
      }
    });
    schedule();
  }

  /* The trigger form: choosing a workflow fills in its example payload,
     unless the payload box holds something typed by hand. */
  function triggerForm() {
    var source = document.getElementById("pilot-payload-examples");
    var select = document.getElementById("id_workflow");
    var payload = document.getElementById("id_payload");
    if (!source || !select || !payload) return;
    var examples = JSON.parse(source.textContent);
    function text(name) {
      return JSON.stringify(examples[name] || {}, null, 2);
    }
    var untouched = {"": true, "{}": true};
    Object.keys(examples).forEach(function (name) { untouched[text(name)] = true; });
    function fill() {
      if (untouched[payload.value.trim()] && examples[select.value] !== undefined) {
        payload.value = text(select.value);
      }
    }
    select.addEventListener("change", fill);
    if (!document.querySelector(".errorlist")) fill();
  }

  /* The filter-wide action: post one chunk after another until done. */
  function bulkProgress() {
    var form = document.getElementById("pilot-bulk-form");
    if (!form || form.getAttribute("data-autorun") !== "yes") return;
    var state = document.getElementById("pilot-bulk-state");
    var bar = document.getElementById("pilot-progress-bar");
    var refusals = document.querySelector("#pilot-refusals tbody");
    // The script runs the job: no Start or Continue beside "working…" (it
    // would post the same chunk twice); offered again only if the script stops.
    var button = document.getElementById("pilot-continue");

    function set(name, value) {
      form.elements[name].value = value;
      var shown = document.getElementById("pilot-" + name);
      if (shown) shown.textContent = value;
    }

    function step() {
      state.textContent = "working…";
      button.style.display = "none";
      button.disabled = true;
      fetch(form.action, {
        method: "POST", body: new FormData(form), credentials: "same-origin",
        headers: {"Accept": "application/json"}
      }).then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      }).then(function (data) {
        ["handled", "changed", "refused", "cursor"].forEach(function (name) {
          set(name, data[name]);
        });
        bar.value = data.handled;
        data.refusals.forEach(function (pair) {
          var row = refusals.insertRow();
          var link = document.createElement("a");
          link.href = "../../../" + pair[0] + "/change/";
          link.textContent = pair[0].slice(0, 8);
          row.insertCell().appendChild(link);
          row.insertCell().textContent = pair[1];
        });
        if (data.done) {
          state.textContent = "done";
          location.href = data.done_url;
        } else {
          step();
        }
      }).catch(function (error) {
        state.textContent = "stopped (" + error.message + "): press Continue to go on";
        button.value = "Continue with the next chunk";
        button.style.display = "";
        button.disabled = false;
      });
    }
    step();
  }

  function start() {
    live();
    triggerForm();
    bulkProgress();
    setInterval(tick, 1000);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
