// The console's WebSocket (Channels through Redis): the footer's server clock, and live
// updates of the page. Elements with data-live-topic ("fleet", "tree", "client.ID",
// "events", "event.UUID") are watched; when the server announces a change, each
// refreshes its own part of the page with htmx (data-live-select says which part of the
// answer), at most every 2 seconds (data-live-interval: other milliseconds), and once
// as the watch begins if marked data-live-catch-up. A part
// where the operator ticked rows is not replaced: a notice offers the refresh. Elements
// with data-elapsed-since (an ISO time) count the time since it, locally, every second.
// A button marked data-clears="SELECTOR" empties the nearest enclosing element that
// matches (a dialog's Cancel): in this file, because the Content-Security-Policy
// allows no inline handler. A renewed CSRF token is handed to the page's forms.
document.addEventListener("click", function (event) {
  const button = event.target.closest("[data-clears]");
  if (button) button.closest(button.dataset.clears).replaceChildren();
});

// A response that renewed the session's CSRF token (a code typed in place, a change of
// roles) hands it over in its HX-Trigger header (console/sessions.py): the page's htmx
// requests and every form on it take it, or their next post would be refused.
document.addEventListener("csrf-renewed", function (event) {
  const token = event.detail.token;
  const body = document.body;
  const headers = JSON.parse(body.getAttribute("hx-headers") || "{}");
  headers["X-CSRFToken"] = token;
  body.setAttribute("hx-headers", JSON.stringify(headers));
  document.querySelectorAll("input[name=csrfmiddlewaretoken]").forEach(function (input) {
    input.value = token;
  });
});

(function () {
  "use strict";
  const footer = document.getElementById("server-clock");
  if (!footer) return;
  const timeEl = footer.querySelector("[data-clock-time]");
  const rttEl = footer.querySelector("[data-clock-rtt]");
  const REFRESH_MS = 2000;
  // The page's own refreshes are not the operator's activity: a page left open must
  // still end its session when idle (console/sessions.py).
  const AUTO_REFRESH = { "X-Auto-Refresh": "1" };
  const SESSION_ENDED = 4440; // the socket's close code (console/consumers.py)
  let socket = null;
  let timer = null;
  let retryDelay = 1000;
  const lastRefresh = new Map();

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(scheme + "://" + window.location.host + footer.dataset.wsPath);
    socket.addEventListener("open", function () {
      retryDelay = 1000;
      footer.dataset.state = "open";
      watch();
      ping();
      timer = window.setInterval(ping, 1000);
    });
    socket.addEventListener("message", function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "time") showTime(message);
      else if (message.type === "changed") changed(message.topic);
      else if (message.type === "watching") caughtUp(message.topics);
    });
    socket.addEventListener("close", function (event) {
      footer.dataset.state = "closed";
      window.clearInterval(timer);
      // The session ended (idle, or at its lifetime): reloading shows the login page,
      // which says why.
      if (event.code === SESSION_ENDED) {
        window.location.reload();
        return;
      }
      timeEl.textContent = "disconnected, retrying…";
      window.setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 30000);
    });
  }

  function watched() {
    return Array.from(document.querySelectorAll("[data-live-topic]"));
  }

  function watch() {
    const topics = Array.from(new Set(watched().map(function (el) { return el.dataset.liveTopic; })));
    if (topics.length) socket.send(JSON.stringify({ type: "watch", topics: topics }));
  }

  function changed(topic) {
    watched().forEach(function (el) {
      if (el.dataset.liveTopic !== topic) return;
      const since = Date.now() - (lastRefresh.get(el) || 0);
      const every = Number(el.dataset.liveInterval) || REFRESH_MS;
      if (el.dataset.refreshPending) return;
      el.dataset.refreshPending = "1";
      window.setTimeout(function () { refresh(el); }, Math.max(0, every - since));
    });
  }

  // A part marked data-live-catch-up is refreshed once when its watch begins: what
  // changed between the page's render and the watch was announced to no one (a report
  // run that finished meanwhile would otherwise show running for ever).
  function caughtUp(topics) {
    footer.dataset.watching = topics.join(" ");
    watched().forEach(function (el) {
      if (el.dataset.liveCatchUp !== undefined && topics.indexOf(el.dataset.liveTopic) >= 0) {
        changed(el.dataset.liveTopic);
      }
    });
  }

  // A code typed in place renews the session's key (console/sessions.py): a refresh
  // sent while it is checked would carry the old key, find no session and log the page
  // out. Refreshes wait for its answer, which brings the new key.
  let renewing = false;
  function renewsSession(event) {
    return event.detail.elt.closest("[data-renews-session]") !== null;
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (renewsSession(event)) renewing = true;
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (renewsSession(event)) renewing = false;
  });

  function refresh(el) {
    if (renewing) {
      window.setTimeout(function () { refresh(el); }, 250);
      return;
    }
    delete el.dataset.refreshPending;
    lastRefresh.set(el, Date.now());
    if (el.querySelector("input[type=checkbox]:checked")) {
      offerRefresh(el);
      return;
    }
    htmx.ajax("GET", window.location.href, {
      target: el, swap: "innerHTML", select: el.dataset.liveSelect || undefined,
      headers: AUTO_REFRESH,
    }).then(function () { el.dataset.liveRefreshed = String(Date.now()); });
  }

  function offerRefresh(el) {
    if (el.querySelector("[data-live-offer]")) return;
    const notice = document.createElement("p");
    notice.className = "notice warn";
    notice.dataset.liveOffer = "1";
    notice.innerHTML = 'This changed since you loaded it. <a href="">Refresh</a> (your ticks will be cleared).';
    el.prepend(notice);
  }

  function showTime(message) {
    timeEl.textContent = message.server_time;
    const rtt = performance.now() - message.client_sent;
    rttEl.textContent = "(round trip " + rtt.toFixed(1) + " ms, channel layer " + message.layer_ms + " ms)";
  }

  function ping() {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "ping", sent: performance.now() }));
    }
  }

  function elapsed(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s ago";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min ago";
  }

  function tick() {
    document.querySelectorAll("[data-elapsed-since]").forEach(function (el) {
      el.textContent = elapsed((Date.now() - Date.parse(el.dataset.elapsedSince)) / 1000);
    });
  }

  window.setInterval(tick, 1000);
  connect();
})();
