/* profwatch report: draws the rank chart with plotly.js and bins ranks when a view holds more ranks than the
   chart has pixels (each bin keeps its largest value, so one slow rank among 4096 stays visible); re-bins on
   zoom. The figure (validated by plotly.py) is in the JSON script #pw-figure. */
(function () {
  "use strict";
  var gd = document.getElementById("pw-rank-chart");
  var src = document.getElementById("pw-figure");
  if (!gd || !src) { return; }
  if (typeof Plotly === "undefined") { console.error("profwatch report: plotly.js did not load"); return; }
  var fig = JSON.parse(src.textContent);
  var full = fig.data;
  var xs = full[0].x;
  var PX_PER_BAR = 2;
  var config = {displaylogo: false, responsive: true, scrollZoom: false,
                modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"],
                toImageButtonOptions: {format: "png", filename: "profwatch-ranks", scale: 2}};

  /* [first, last] indices of the points to draw: the view, plus one view width on each side (for panning) */
  function window_(range) {
    if (!range) { return {a: 0, b: xs.length - 1, n: xs.length}; }
    var lo = Math.min(range[0], range[1]), hi = Math.max(range[0], range[1]), span = hi - lo, n = 0;
    var a = xs.length, b = -1;
    for (var i = 0; i < xs.length; i++) {
      if (xs[i] >= lo && xs[i] <= hi) { n++; }
      if (xs[i] >= lo - span && xs[i] <= hi + span) { a = Math.min(a, i); b = Math.max(b, i); }
    }
    return b < a ? {a: 0, b: -1, n: 0} : {a: a, b: b, n: n};
  }

  function binSize(n) {
    var px = Math.max(200, gd.clientWidth - 110);
    return Math.max(1, Math.ceil(n / Math.max(50, Math.floor(px / PX_PER_BAR))));
  }

  function score(v, mode) {
    if (v === null || v === undefined) { return -Infinity; }
    return mode === "max" ? v : Math.abs(v);
  }

  function groups(a, b, k) {
    var out = [];
    for (var i = a; i <= b; i += k) { out.push([i, Math.min(b, i + k - 1)]); }
    return out;
  }

  function label(x, g) {
    return g[0] === g[1] ? "" : " (largest of ranks " + x[g[0]] + "-" + x[g[1]] + ")";
  }

  function binBars(t, w, k) {
    var g = groups(w.a, w.b, k), o = Object.assign({}, t);
    var colors = t.marker && Array.isArray(t.marker.color) ? t.marker.color : null;
    o.x = []; o.y = []; o.customdata = []; o.text = []; o.width = [];
    if (colors) { o.marker = Object.assign({}, t.marker, {color: []}); }
    g.forEach(function (gr) {
      var best = gr[0];
      for (var i = gr[0] + 1; i <= gr[1]; i++) { if (score(t.y[i], t.meta) > score(t.y[best], t.meta)) { best = i; } }
      o.x.push((t.x[gr[0]] + t.x[gr[1]]) / 2);
      o.width.push((t.x[gr[1]] - t.x[gr[0]] + 1) * (k > 1 ? 0.9 : 0.8));
      o.y.push(t.y[best]);
      o.customdata.push(t.customdata[best]);
      o.text.push(label(t.x, gr));
      if (colors) { o.marker.color.push(colors[best]); }
    });
    return o;
  }

  function binHeat(t, w, k) {
    var g = groups(w.a, w.b, k), o = Object.assign({}, t);
    o.x = g.map(function (gr) { return (t.x[gr[0]] + t.x[gr[1]]) / 2; });
    o.z = []; o.customdata = []; o.text = [];
    t.z.forEach(function (row, s) {
      var z = [], cd = [], tx = [];
      g.forEach(function (gr) {
        var best = gr[0];
        for (var i = gr[0] + 1; i <= gr[1]; i++) { if (score(row[i], "absmax") > score(row[best], "absmax")) { best = i; } }
        z.push(row[best]); cd.push(t.customdata[s][best]); tx.push(label(t.x, gr));
      });
      o.z.push(z); o.customdata.push(cd); o.text.push(tx);
    });
    return o;
  }

  function traces(w, k) {
    var whole = w.a === 0 && w.b === xs.length - 1;
    return full.map(function (t) {
      if (t.meta === "keep" || (k <= 1 && whole)) { return t; }
      return t.meta === "heat" ? binHeat(t, w, k) : binBars(t, w, k);
    });
  }

  var busy = false;
  function draw(range) {
    var w = window_(range), k = binSize(w.n);
    busy = true;
    var layout = Object.assign({}, gd.layout && gd.data ? gd.layout : fig.layout);
    Object.keys(layout).forEach(function (key) {  // every (matched) rank axis gets the same range
      if (!/^xaxis\d*$/.test(key)) { return; }
      layout[key] = Object.assign({}, layout[key], range ? {range: [range[0], range[1]], autorange: false}
                                                          : {autorange: true});
    });
    return Plotly.react(gd, traces(w, k), layout, config).then(function () {
      busy = false;
      gd.setAttribute("data-bin-size", String(k));
      gd.setAttribute("data-rendered", "1");
    }, function (err) { busy = false; console.error("profwatch report: chart failed", err); });
  }

  function rangeOf(ev) {
    var keys = Object.keys(ev);
    for (var i = 0; i < keys.length; i++) {
      var m = /^xaxis\d*\.range\[0\]$/.exec(keys[i]);
      if (m) { return [ev[keys[i]], ev[keys[i].replace("[0]", "[1]")]]; }
      if (/^xaxis\d*\.range$/.test(keys[i])) { return ev[keys[i]]; }
      if (/^xaxis\d*\.autorange$/.test(keys[i])) { return null; }
    }
    return undefined;
  }

  draw(null).then(function () {
    gd.on("plotly_relayout", function (ev) {
      if (busy) { return; }
      var r = rangeOf(ev || {});
      if (r !== undefined) { draw(r); }
    });
  });
})();
