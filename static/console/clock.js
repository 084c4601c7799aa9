// Server-time echo over the console's WebSocket (Channels through Redis).
// Sends a ping every second; the server answers after a round trip through the
// channel layer, so a ticking clock proves the whole path works.
(function () {
  "use strict";
  const footer = document.getElementById("server-clock");
  if (!footer) return;
  const timeEl = footer.querySelector("[data-clock-time]");
  const rttEl = footer.querySelector("[data-clock-rtt]");
  let socket = null;
  let timer = null;
  let retryDelay = 1000;

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(scheme + "://" + window.location.host + footer.dataset.wsPath);
    socket.addEventListener("open", function () {
      retryDelay = 1000;
      footer.dataset.state = "open";
      ping();
      timer = window.setInterval(ping, 1000);
    });
    socket.addEventListener("message", function (event) {
      const message = JSON.parse(event.data);
      if (message.type !== "time") return;
      timeEl.textContent = message.server_time;
      const rtt = performance.now() - message.client_sent;
      rttEl.textContent = "(round trip " + rtt.toFixed(1) + " ms, channel layer " + message.layer_ms + " ms)";
    });
    socket.addEventListener("close", function () {
      footer.dataset.state = "closed";
      window.clearInterval(timer);
      timeEl.textContent = "disconnected, retrying…";
      window.setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 30000);
    });
  }

  function ping() {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "ping", sent: performance.now() }));
    }
  }

  connect();
})();
