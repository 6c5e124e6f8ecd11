// Berth dashboard: live regions and log streams, over server-sent events.
// A page names its event stream in <body data-events>; on a change the
// page's [data-live] regions are fetched again and swapped in place, at
// most once per <body data-refresh> milliseconds. An instance page streams its logs into #logs.
(function () {
  'use strict';

  var status = document.getElementById('live-status');
  function say(text) { if (status) { status.textContent = 'Live updates: ' + text; } }

  function refresh() {
    return fetch(location.href, { credentials: 'same-origin', headers: { 'Accept': 'text/html' } })
      .then(function (r) {
        if (r.redirected || !r.ok) { throw new Error('status ' + r.status); }
        return r.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, 'text/html');
        document.querySelectorAll('[data-live]').forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (!fresh) { return; }
          // Keep the keyboard where it was: refocus the same link or
          // control in the fresh region.
          var active = document.activeElement, again = null;
          if (active && el.contains(active)) {
            var key = active.getAttribute('href') || active.id;
            again = function (root) {
              return key && (root.querySelector('[href="' + CSS.escape(key) + '"]') || root.querySelector('#' + CSS.escape(key)));
            };
          }
          var node = document.importNode(fresh, true);
          el.replaceWith(node);
          var target = again && again(node);
          if (target) { target.focus(); }
        });
        say('on, updated ' + new Date().toLocaleTimeString());
      })
      .catch(function (e) { say('could not refresh (' + e.message + '); reload the page'); });
  }

  var src = document.body.dataset.events;
  if (src && window.EventSource) {
    var waiting = false, last = 0, broken = false;
    var every = Number(document.body.dataset.refresh) || 1000;
    var schedule = function () {
      if (waiting) { return; }
      waiting = true;
      setTimeout(function () {
        waiting = false;
        last = Date.now();
        refresh();
      }, Math.max(0, every - (Date.now() - last)));
    };
    var es = new EventSource(src);
    es.addEventListener('hello', function () {
      say('on');
      if (broken) { broken = false; schedule(); } // changes may have been missed
    });
    es.addEventListener('change', schedule);
    es.onerror = function () { broken = true; say('interrupted, reconnecting…'); };
  }

  var pre = document.getElementById('logs');
  if (pre && pre.dataset.src && window.EventSource) {
    var logStatus = document.getElementById('logs-status');
    var max = 256 * 1024;
    var ls = new EventSource(pre.dataset.src);
    ls.addEventListener('open', function () { logStatus.textContent = 'Following the output.'; });
    ls.addEventListener('log', function (e) {
      var f = JSON.parse(e.data);
      var stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.append(document.createTextNode(f.data));
      if (pre.textContent.length > max) { pre.textContent = pre.textContent.slice(-max); }
      if (stick) { pre.scrollTop = pre.scrollHeight; }
    });
    ls.addEventListener('end', function (e) {
      ls.close();
      var f = JSON.parse(e.data);
      logStatus.textContent = f.error ? 'The log stream ended: ' + f.error : 'The output ended.';
    });
    ls.onerror = function () {
      // Reconnecting would replay the tail: stop, and say how to go on.
      ls.close();
      logStatus.textContent = 'The log stream was interrupted; reload the page to follow again.';
    };
  }
})();
