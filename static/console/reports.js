// The report pages' charts (Apache ECharts, static/vendor/echarts-6.1.0). Each chart is
// a <div data-chart="KIND.NAME" data-source="ID"> whose rows come from the page's
// json_script ID ({kind, summary, sections: {name: {label, fields, rows}}}, rows as
// the job wrote them: times ISO 8601 UTC, seconds as numbers). Charts are drawn when
// the page loads and whenever htmx brings in new content (a run that just finished).
(function () {
  "use strict";

  const COLORS = {
    ok: "#2da44e", failed: "#cf222e", waiting: "#54aeff", expired: "#8c959f",
    p50: "#54aeff", p95: "#d4a72c", p99: "#cf222e",
    send: "#1f6feb", policy: "#8250df", trust: "#bf8700",
    routed: "#2da44e", wasted: "#cf222e", loss: "#d4a72c",
  };
  const MANY_CATEGORIES = 16; // more than this: a slider picks which to show
  const charts = new Map();

  // --- helpers -------------------------------------------------------------------
  function rowsOf(data, section) {
    const found = data.sections[section];
    return found ? found.rows : [];
  }

  function seconds(value) {
    if (value === null || value === undefined) return "—";
    if (value < 1) return (value * 1000).toFixed(0) + " ms";
    if (value < 60) return value.toFixed(1) + " s";
    return Math.floor(value / 60) + " min " + Math.round(value % 60) + " s";
  }

  function percent(value) {
    return value === null || value === undefined ? "—" : (value * 100).toFixed(1) + " %";
  }

  function shortTime(iso) {
    return iso ? iso.slice(11, 19) : "";
  }

  function sumBy(rows, keyOf, valueOf) {
    const totals = new Map();
    rows.forEach(function (row) {
      const key = keyOf(row);
      totals.set(key, (totals.get(key) || 0) + (valueOf(row) || 0));
    });
    return totals;
  }

  function base(title, extra) {
    return Object.assign({
      title: { text: title, left: 0, textStyle: { fontSize: 14, fontWeight: 600 } },
      legend: { top: 26, left: 0, type: "scroll" },
      grid: { top: 70, left: 8, right: 24, bottom: 8, containLabel: true },
      // Drawn in the canvas, not as HTML: names in a tooltip (clients, audit targets) are
      // text, and the page's Content-Security-Policy allows no inline style.
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, renderMode: "richText" },
      animation: false,
    }, extra);
  }

  function zoomFor(count) {
    if (count <= MANY_CATEGORIES) return [];
    const end = Math.min(100, Math.round((MANY_CATEGORIES / count) * 100));
    return [{ type: "slider", start: 0, end: end, bottom: 4, height: 18 }];
  }

  // Bars per category: series = [{name, value(row), color}], stacked or side by side.
  function categoryBars(title, rows, label, series, opts) {
    const categories = rows.map(label);
    const zoom = zoomFor(categories.length);
    const option = base(title, {
      xAxis: { type: "category", data: categories, axisLabel: { interval: 0, rotate: categories.length > 8 ? 30 : 0, width: 140, overflow: "truncate" } },
      yAxis: { type: "value", minInterval: opts.seconds ? 0 : 1, axisLabel: opts.seconds ? { formatter: seconds } : opts.percent ? { formatter: percent } : {} },
      dataZoom: zoom,
      series: series.map(function (s) {
        return {
          name: s.name, type: "bar", stack: opts.stacked ? "total" : undefined, barMaxWidth: 48,
          itemStyle: s.color ? { color: s.color } : undefined,
          data: rows.map(s.value), emphasis: { focus: "series" },
        };
      }),
    });
    if (zoom.length) option.grid.bottom = 34;
    if (opts.seconds) option.tooltip.valueFormatter = seconds;
    if (opts.percent) option.tooltip.valueFormatter = percent;
    return option;
  }

  // --- the charts of each report -------------------------------------------------
  const DRAW = {};

  // Buckets of the whole window (the job's: multiples of bucket_s since the epoch), so
  // that quiet stretches show as such; the markers sit on the bucket they fell in.
  DRAW["timeline.events"] = function (data, title) {
    const size = (data.summary.bucket_s || 60) * 1000;
    const first = Math.floor(Date.parse(data.window[0]) / size) * size;
    const count = Math.max(1, Math.ceil((Date.parse(data.window[1]) - first) / size));
    const indexOf = function (iso) { return Math.floor((Date.parse(iso) - first) / size); };
    const labels = [];
    for (let i = 0; i < count; i++) labels.push(bucketLabel(first + i * size, count * size));
    const rows = rowsOf(data, "series");
    const kinds = Array.from(new Set(rows.map(function (r) { return r.kind || "(none)"; }))).sort();
    const totals = new Array(count).fill(0);
    const series = kinds.map(function (kind) {
      const values = new Array(count).fill(0);
      rows.forEach(function (r) {
        const i = indexOf(r.bucket);
        if ((r.kind || "(none)") === kind && i >= 0 && i < count) { values[i] += r.events; totals[i] += r.events; }
      });
      return { name: kind, type: "bar", stack: "events", data: values, barMaxWidth: 28, emphasis: { focus: "series" } };
    });
    const top = Math.max(1, Math.max.apply(null, totals));
    const markers = markersByBucket(rowsOf(data, "markers"), indexOf, count);
    series.push(sendLines(markers.send));
    series.push(changePins("policy changes", markers.policy, COLORS.policy, top * 1.2, "diamond"));
    series.push(changePins("trust changes", markers.trust, COLORS.trust, top * 1.5, "triangle"));
    const zoom = count > 60 ? [{ type: "slider", bottom: 4, height: 18 }] : [];
    return base(title, {
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" }, renderMode: "richText", formatter: function (items) {
        return timelineTip(items, labels, markers);
      } },
      grid: { top: 70, left: 8, right: 24, bottom: zoom.length ? 34 : 8, containLabel: true },
      xAxis: { type: "category", data: labels, axisTick: { alignWithLabel: true } },
      yAxis: { type: "value", minInterval: 1, max: Math.ceil(top * 1.75) },
      dataZoom: zoom,
      series: series,
    });
  };

  function bucketLabel(ms, span) {
    const iso = new Date(ms).toISOString();
    return span > 86400000 ? iso.slice(5, 10) + " " + iso.slice(11, 16) : iso.slice(11, 16);
  }

  function markersByBucket(markers, indexOf, count) {
    const found = { send: new Map(), policy: new Map(), trust: new Map() };
    markers.forEach(function (m) {
      const i = indexOf(m.at);
      if (!found[m.type] || i < 0 || i >= count) return;
      if (!found[m.type].has(i)) found[m.type].set(i, []);
      found[m.type].get(i).push(m);
    });
    return found;
  }

  function sendLines(sends) {
    return {
      name: "sends", type: "line", data: [], itemStyle: { color: COLORS.send },
      markLine: {
        symbol: "none", silent: true,
        lineStyle: { color: COLORS.send, type: "dashed", width: 1.5 },
        label: { formatter: "{b}", position: "insideStartTop", color: COLORS.send, fontSize: 11 },
        data: Array.from(sends.entries()).map(function (e) {
          const by = Array.from(new Set(e[1].map(function (m) { return (m.actor || "").replace(/^user:/, ""); })));
          const what = e[1].length > 1 ? e[1].length + " sends" : "send";
          return { xAxis: e[0], name: what + " by " + by.slice(0, 2).join(", ") + (by.length > 2 ? "…" : "") };
        }),
      },
    };
  }

  function changePins(name, changes, color, height, symbol) {
    return {
      name: name, type: "line", data: [], itemStyle: { color: color }, symbol: symbol,
      markPoint: {
        symbol: symbol, symbolSize: 16, silent: true, itemStyle: { color: color },
        label: { show: true, position: "right", color: color, fontSize: 11, fontWeight: 600 },
        data: Array.from(changes.entries()).map(function (e) {
          return { coord: [e[0], height], value: e[1].length };
        }),
      },
    };
  }

  function timelineTip(items, labels, markers) {
    const i = items.length ? items[0].dataIndex : -1;
    const lines = [labels[i] + " UTC"];
    items.forEach(function (item) {
      if (item.seriesType === "bar" && item.value) lines.push(item.seriesName + ": " + item.value + " events");
    });
    [["send", "sends"], ["policy", "policy changes"], ["trust", "trust changes"]].forEach(function (t) {
      const found = markers[t[0]].get(i);
      if (!found) return;
      lines.push(found.length + " " + t[1] + ": " + found.slice(0, 4).map(function (m) {
        return shortTime(m.at) + " " + m.action + " " + (m.target || "");
      }).join("; ") + (found.length > 4 ? "; …" : ""));
    });
    // Rich text: braces and pipes would be read as style markup.
    return lines.map(function (line) { return line.replace(/[{}|]/g, " "); }).join("\n");
  }

  DRAW["reach.outcomes"] = function (data, title) {
    const rows = rowsOf(data, "commands");
    return categoryBars(title, rows, commandLabel, [
      { name: "acknowledged ok", color: COLORS.ok, value: function (r) { return r.acked_ok; } },
      { name: "failed", color: COLORS.failed, value: function (r) { return r.failed; } },
      { name: "no answer", color: COLORS.waiting, value: function (r) { return r.no_answer; } },
      { name: "expired", color: COLORS.expired, value: function (r) { return r.expired; } },
    ], { stacked: true });
  };

  DRAW["reach.times"] = function (data, title) {
    const rows = rowsOf(data, "commands");
    return categoryBars(title, rows, commandLabel, [50, 90, 99].map(function (p) {
      return { name: p + " % ok", color: COLORS["p" + (p === 90 ? 95 : p)], value: function (r) { return r["t" + p + "_s"]; } };
    }), { seconds: true });
  };

  function commandLabel(row) {
    return (row.action || row.kind || "event") + "\n" + shortTime(row.published_at);
  }

  DRAW["latency.hops"] = function (data, title) {
    return latencyBars(title, rowsOf(data, "by_hops"), function (r) {
      return r.hops === null || r.hops === undefined ? "unknown" : r.hops + " hop" + (r.hops === 1 ? "" : "s");
    });
  };

  DRAW["latency.regions"] = function (data, title) {
    return latencyBars(title, rowsOf(data, "by_region"), function (r) { return r.region; });
  };

  // Delivery in blues, acknowledgement in oranges, darker for the higher percentile.
  const LATENCY_COLORS = {
    delivery: { p50: "#9ecbff", p95: "#388bfd", p99: "#0a3069" },
    ack: { p50: "#ffc680", p95: "#fb8f44", p99: "#953800" },
  };

  function latencyBars(title, rows, label) {
    const series = [];
    [["delivery", "delivery"], ["ack", "ack"]].forEach(function (measure) {
      ["p50", "p95", "p99"].forEach(function (p) {
        series.push({
          name: measure[1] + " " + p, color: LATENCY_COLORS[measure[0]][p],
          value: function (r) { return r[measure[0] + "_" + p + "_s"]; },
        });
      });
    });
    return categoryBars(title, rows, label, series, { seconds: true });
  }

  // The actors with the most refusals (the table has them all), stacked by reason.
  const TOP_ACTORS = 20;

  DRAW["audit.refusals"] = function (data, title) {
    const rows = rowsOf(data, "refusals");
    const categories = Array.from(new Set(rows.map(function (r) { return r.category || "other"; }))).sort();
    const actors = Array.from(sumBy(rows, function (r) { return r.actor; }, function (r) { return r.entries; }).entries())
      .sort(function (a, b) { return b[1] - a[1]; }).slice(0, TOP_ACTORS).map(function (e) { return e[0]; });
    const byActor = actors.map(function (actor) { return { actor: actor }; });
    rows.forEach(function (r) {
      const i = actors.indexOf(r.actor);
      if (i >= 0) byActor[i][r.category || "other"] = (byActor[i][r.category || "other"] || 0) + r.entries;
    });
    return categoryBars(title, byActor, function (r) { return r.actor; }, categories.map(function (c) {
      return { name: c.replace(/_/g, " "), color: REFUSAL_COLORS[c], value: function (r) { return r[c] || 0; } };
    }), { stacked: true });
  };

  const REFUSAL_COLORS = {
    sender_not_qualified: "#cf222e", content_filtered: "#d4a72c",
    attribute_not_authorised: "#8250df", role_refused: "#0969da", other: "#8c959f",
  };

  // What was done and what was refused, per group of actions, over every actor.
  DRAW["audit.activity"] = function (data, title) {
    const rows = rowsOf(data, "activity");
    const done = sumBy(rows, function (r) { return r.group; }, function (r) { return r.done; });
    const refused = sumBy(rows, function (r) { return r.group; }, function (r) { return r.refused; });
    const groups = Array.from(done.keys()).sort(function (a, b) {
      return (done.get(b) + refused.get(b)) - (done.get(a) + refused.get(a));
    }).map(function (group) { return { group: group, done: done.get(group), refused: refused.get(group) }; });
    return categoryBars(title, groups, function (r) { return r.group; }, [
      { name: "done", color: COLORS.ok, value: function (r) { return r.done; } },
      { name: "refused", color: COLORS.failed, value: function (r) { return r.refused; } },
    ], { stacked: true });
  };

  DRAW["tree.forwards"] = function (data, title) {
    const rows = rowsOf(data, "dispatchers");
    return categoryBars(title, rows, function (r) { return r.dispatcher; }, [
      { name: "events routed", color: COLORS.waiting, value: function (r) { return r.routed; } },
      { name: "forwards", color: COLORS.routed, value: function (r) { return r.forwards; } },
      { name: "wasted forwards", color: COLORS.wasted, value: function (r) { return r.wasted; } },
    ], {});
  };

  DRAW["tree.loss"] = function (data, title) {
    const rows = rowsOf(data, "dispatchers");
    return categoryBars(title, rows, function (r) { return r.dispatcher; }, [
      { name: "coagulation loss", color: COLORS.loss, value: function (r) { return r.loss; } },
      { name: "wasted share of routed", color: COLORS.wasted, value: function (r) { return r.wasted_share; } },
    ], { percent: true });
  };

  // --- drawing -------------------------------------------------------------------
  function draw(el) {
    if (charts.has(el) || typeof echarts === "undefined") return;
    const source = document.getElementById(el.dataset.source);
    const make = DRAW[el.dataset.chart];
    if (!source || !make) return;
    const chart = echarts.init(el, null, { renderer: "canvas" });
    charts.set(el, chart);
    try {
      chart.setOption(make(JSON.parse(source.textContent), el.dataset.title));
      el.dataset.drawn = "1";
    } catch (error) {
      el.dataset.drawn = "error";
      el.textContent = "This chart could not be drawn: " + error;
    }
  }

  function drawWithin(root) {
    // Charts whose div left the page (replaced by a live refresh) are let go.
    charts.forEach(function (chart, el) {
      if (!document.body.contains(el)) { chart.dispose(); charts.delete(el); }
    });
    const scope = root && root.querySelectorAll ? root : document;
    scope.querySelectorAll("[data-chart]").forEach(draw);
  }

  window.addEventListener("resize", function () {
    charts.forEach(function (chart) { chart.resize(); });
  });
  htmx.onLoad(drawWithin);
})();
