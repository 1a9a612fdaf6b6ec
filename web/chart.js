/* chart.js — the charts. The loss chart: a <canvas> with the mean over ranks as the main line, one
 * thin line per rank (each can be hidden), a linear or log y axis, optional smoothing
 * (TensorBoard's debiased exponential moving average), markers (a rank that joined, a
 * restart), and a hover read-out of the step and the values there. EvalChart: the eval
 * events' loss (left axis) and accuracy (right axis, 0..1) per step, with a read-out.
 * LineChart: any number of named series against a step, samples or time axis (the lr and
 * gradient-norm charts, the compare page's overlaid curves).
 *
 * Fed either live, one loss event at a time (addLoss: the mean of a step is the mean of
 * the ranks that reported it so far), or from /metrics (setMetrics), or both: a running
 * job with a long history starts from /metrics and continues with the live tail. Drawing
 * is at most once per animation frame and takes per pixel column the first, lowest,
 * highest and last point, so a series of a million points draws as fast as one of a
 * thousand. */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});
  const {el, fmtLoss, fmtInt} = ddpd.util;

  const PALETTE = ['#e8590c', '#2f9e44', '#7048e8', '#d6336c', '#1098ad', '#f08c00', '#5c940d', '#ae3ec9',
    '#0b7285', '#c92a2a', '#364fc7', '#862e9c'];
  const PAD = {left: 64, right: 16, top: 18, bottom: 30};

  function lowerBound(a, x) {
    let lo = 0, hi = a.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (a[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /* Index of the element of sorted `a` nearest to x (-1 when empty). */
  function nearest(a, x) {
    if (!a.length) return -1;
    const i = lowerBound(a, x);
    if (i === 0) return 0;
    if (i === a.length) return a.length - 1;
    return x - a[i - 1] <= a[i] - x ? i - 1 : i;
  }

  function niceStep(range, count) {
    const raw = range / Math.max(1, count);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
  }

  function linearTicks(min, max, count) {
    if (!(max > min)) return [min];
    const step = niceStep(max - min, count);
    const out = [];
    for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }

  function logTicks(min, max) {
    const lo = Math.floor(Math.log10(min)), hi = Math.ceil(Math.log10(max));
    const decades = hi - lo;
    const every = decades > 8 ? Math.ceil(decades / 6) : 1;
    const out = [];
    for (let k = lo; k <= hi; k += every) {
      const mults = decades <= 3 ? [1, 2, 5] : [1];
      for (const m of mults) {
        const v = m * Math.pow(10, k);
        if (v >= min * 0.999 && v <= max * 1.001) out.push(v);
      }
    }
    return out;
  }

  function fmtTick(v) {
    if (v === 0) return '0';
    const a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential(0).replace('e+', 'e');
    return String(Number(v.toPrecision(3)));
  }

  /* A step on the axis, in the unit that suits the axis' largest step. */
  function fmtStep(v, max) {
    if (max >= 2e6) return Number((v / 1e6).toPrecision(4)) + 'M';
    if (max >= 2e4) return Number((v / 1e3).toPrecision(4)) + 'k';
    return String(Math.round(v));
  }

  /* TensorBoard's smoothing: an exponential moving average with weight w (0 = none),
   * debiased so that the first points are not pulled towards 0; non-finite values pass
   * through and do not count. */
  function ema(vals, w) {
    const out = new Array(vals.length);
    let last = 0, n = 0;
    for (let i = 0; i < vals.length; i++) {
      const v = vals[i];
      if (!Number.isFinite(v)) {
        out[i] = v;
        continue;
      }
      last = last * w + (1 - w) * v;
      n++;
      out[i] = last / (1 - Math.pow(w, n));
    }
    return out;
  }

  /* The horizontal grid lines at `ticks` (y = Y(v)) across the plot, each labelled at its
   * left; the context's styles as the caller set them. */
  function yGrid(ctx, ticks, Y, pad, pw) {
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (const v of ticks) {
      const y = Math.round(Y(v)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(pad.left, y);
      ctx.lineTo(pad.left + pw, y);
      ctx.stroke();
      ctx.fillText(fmtTick(v), pad.left - 6, y);
    }
  }

  /* Sizes the canvas to its box (at least 200 × 160, `height` when the box has none) for
   * the screen's pixel ratio, clears it, and reads the theme's chart colours. Both charts
   * start every draw with it. */
  function beginDraw(box, c, height) {
    const ctx = c.getContext('2d');
    const dpr = window.devicePixelRatio || 1;
    const W = Math.max(200, box.clientWidth), H = Math.max(160, box.clientHeight || height);
    if (c.width !== Math.round(W * dpr) || c.height !== Math.round(H * dpr)) {
      c.width = Math.round(W * dpr);
      c.height = Math.round(H * dpr);
      c.style.width = W + 'px';
      c.style.height = H + 'px';
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const css = getComputedStyle(box);
    const fg = css.getPropertyValue('--chart-fg').trim() || '#333';
    const grid = css.getPropertyValue('--chart-grid').trim() || '#e5e5e5';
    const mean = css.getPropertyValue('--chart-mean').trim() || '#1c7ed6';
    ctx.clearRect(0, 0, W, H);
    ctx.font = '11px system-ui, sans-serif';
    return {ctx, W, H, fg, grid, mean};
  }

  /* The line through (xs[i], ys[i]) (xs ascending) from x0 on, decimated per pixel column
   * (its first, lowest, highest and last point), cut where a value is not finite (or not
   * positive on a log axis); a single point is a dot. The stroke style is the caller's. */
  function drawLine(ctx, xs, ys, X, Y, x0, log) {
    const n = xs.length;
    const ok = (v) => Number.isFinite(v) && (!log || v > 0);
    const start = Math.max(0, lowerBound(xs, x0) - 1);
    let col = null, first = 0, mn = 0, mx = 0, last = 0, pen = false;
    const flush = () => {
      if (col === null) return;
      if (!pen) {
        ctx.moveTo(col, first);
        pen = true;
      } else ctx.lineTo(col, first);
      if (mn !== first) ctx.lineTo(col, mn);
      if (mx !== mn) ctx.lineTo(col, mx);
      if (last !== mx) ctx.lineTo(col, last);
    };
    ctx.beginPath();
    if (n === 1 && ok(ys[0])) {
      ctx.arc(X(xs[0]), Y(ys[0]), 2.5, 0, Math.PI * 2);
      ctx.fillStyle = ctx.strokeStyle;
      ctx.fill();
      return;
    }
    for (let i = start; i < n; i++) {
      const v = ys[i];
      if (!ok(v)) {
        flush();
        col = null;
        pen = false;
        continue;
      }
      const x = Math.round(X(xs[i]) * 2) / 2, y = Y(v);
      if (x !== col) {
        flush();
        col = x;
        first = mn = mx = last = y;
      } else {
        if (y < mn) mn = y;
        if (y > mx) mx = y;
        last = y;
      }
    }
    flush();
    ctx.stroke();
  }

  /* What both charts share: a canvas and a tooltip in a box that follows its container's
   * size, the pointer's x for the tooltip, and one draw per animation frame however many
   * changes ask for it. A subclass draws (draw()) and calls request() after a change. */
  class CanvasChart {
    constructor(container, boxClass, canvasClass, label) {
      this.box = el('div', {class: boxClass});
      this.canvas = el('canvas', {class: canvasClass, dataset: {points: '0'}, 'aria-label': label});
      this.tip = el('div', {class: 'chart-tip', hidden: true});
      this.box.append(this.canvas, this.tip);
      container.appendChild(this.box);
      this.hoverX = null;
      this.pending = false;
      this.canvas.addEventListener('mousemove', (e) => {
        this.hoverX = e.clientX - this.canvas.getBoundingClientRect().left;
        this.request();
      });
      this.canvas.addEventListener('mouseleave', () => {
        this.hoverX = null;
        this.request();
      });
      this.ro = new ResizeObserver(() => this.request());
      this.ro.observe(this.box);
    }

    destroy() {
      this.ro.disconnect();
      this.box.remove();
    }

    /* A log y axis or a linear one (the loss and line charts). */
    setLog(on) {
      this.log = on;
      this.request();
    }

    /* 0 (off) .. 0.99: the weight of the moving average the lines are drawn with. */
    setSmoothing(w) {
      this.smoothing = Math.min(0.999, Math.max(0, Number(w) || 0));
      this.request();
    }

    request() {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => {
        this.pending = false;
        this.draw();
      });
    }

    /* Where the pointer is across the plot (0 at pad.left .. 1 at pad.left + pw), or null
     * (the tooltip hidden) when it is not over the plot. */
    hoverFraction(pad, pw) {
      if (this.hoverX === null || this.hoverX < pad.left || this.hoverX > pad.left + pw) {
        this.tip.hidden = true;
        return null;
      }
      return (this.hoverX - pad.left) / pw;
    }

    /* The hover line at x across the plot's height ph. */
    crosshair(ctx, x, pad, ph, fg) {
      ctx.save();
      ctx.strokeStyle = fg;
      ctx.globalAlpha = 0.35;
      ctx.beginPath();
      ctx.moveTo(x, pad.top);
      ctx.lineTo(x, pad.top + ph);
      ctx.stroke();
      ctx.restore();
    }

    /* The tooltip's rows beside x (left of it where the right would leave the W-wide
     * canvas), `top` pixels down. */
    showTip(rows, x, W, top) {
      ddpd.util.fill(this.tip, rows);
      this.tip.hidden = false;
      const tw = this.tip.offsetWidth;
      this.tip.style.left = (x + 12 + tw > W ? x - 12 - tw : x + 12) + 'px';
      this.tip.style.top = top + 'px';
    }
  }

  class LossChart extends CanvasChart {
    constructor(container) {
      super(container, 'chart-box', 'chart-canvas', 'loss chart');
      this.series = new Map(); /* key -> {key, label, color, width, steps, loss, visible, attempt} */
      this.order = [];
      this.acc = new Map(); /* live mean: step -> {sum, n, ranks: Set, attempt} */
      this.meanBase = 0; /* steps up to here came from /metrics */
      this.baseAttempt = 0;
      this.markers = [];
      this.log = false;
      this.smoothing = 0;
      this.onSeries = null; /* called with a series when one appears */
      this.ensure('mean', 'mean of ranks');
    }

    ensure(key, label) {
      let s = this.series.get(key);
      if (!s) {
        const rank = key === 'mean' ? -1 : Number(key.slice(1));
        s = {key, rank, label, steps: [], loss: [], visible: true, attempt: 0,
          color: rank < 0 ? null : PALETTE[rank % PALETTE.length], width: rank < 0 ? 2.25 : 1};
        this.series.set(key, s);
        this.order.push(key);
        this.order.sort((a, b) => (a === 'mean' ? -1 : b === 'mean' ? 1 : Number(a.slice(1)) - Number(b.slice(1))));
        if (this.onSeries) this.onSeries(s);
      }
      return s;
    }

    rank(r) {
      return this.ensure('r' + r, 'rank ' + r);
    }

    points() {
      let n = 0;
      for (const s of this.series.values()) n += s.steps.length;
      return n;
    }

    /* /metrics: {mean: {step, loss}, ranks: [{rank, step, loss}]}; `attempt` is the job's
     * attempt when it was read (live events of that attempt at these steps are repeats). */
    setMetrics(m, attempt) {
      const put = (s, src) => {
        s.steps = [];
        s.loss = [];
        if (!src) return;
        for (let i = 0; i < src.step.length; i++) {
          s.steps.push(src.step[i]);
          s.loss.push(src.loss[i] === null ? NaN : src.loss[i]);
        }
        s.attempt = attempt || 0;
      };
      put(this.ensure('mean', 'mean of ranks'), m.mean);
      for (const r of m.ranks || []) put(this.rank(r.rank), r);
      const mean = this.series.get('mean');
      this.meanBase = mean.steps.length ? mean.steps[mean.steps.length - 1] : 0;
      this.baseAttempt = attempt || 0;
      this.acc.clear();
      this.request();
    }

    /* One loss event. A step at or before the rank's last one is a restart (a later
     * attempt: the line is cut back to there) or a repeat (ignored). */
    addLoss(rank, step, loss, attempt) {
      attempt = attempt || 0;
      const v = loss === null || loss === undefined ? NaN : loss;
      const s = this.rank(rank);
      const n = s.steps.length;
      if (n && step <= s.steps[n - 1]) {
        if (attempt <= s.attempt) return;
        const k = lowerBound(s.steps, step);
        s.steps.length = k;
        s.loss.length = k;
      }
      s.attempt = Math.max(s.attempt, attempt);
      s.steps.push(step);
      s.loss.push(v);
      this.addMean(rank, step, v, attempt);
      this.request();
    }

    addMean(rank, step, v, attempt) {
      const mean = this.series.get('mean');
      if (step <= this.meanBase && attempt <= this.baseAttempt) return;
      let a = this.acc.get(step);
      if (a && (a.ranks.has(rank) || attempt > a.attempt)) {
        if (attempt <= a.attempt) return;
        /* A restart: the steps from here on are new. */
        for (const k of Array.from(this.acc.keys())) if (k >= step) this.acc.delete(k);
        const i = lowerBound(mean.steps, step);
        mean.steps.length = i;
        mean.loss.length = i;
        a = null;
      } else if (!a && attempt > this.baseAttempt && step <= this.meanBase) {
        const i = lowerBound(mean.steps, step);
        mean.steps.length = i;
        mean.loss.length = i;
        this.meanBase = step - 1;
      }
      if (!a) {
        a = {sum: 0, n: 0, ranks: new Set(), attempt};
        this.acc.set(step, a);
        if (this.acc.size > 50000) {
          let drop = 25000;
          for (const k of this.acc.keys()) {
            this.acc.delete(k);
            if (--drop === 0) break;
          }
        }
      }
      a.ranks.add(rank);
      if (Number.isFinite(v)) {
        a.sum += v;
        a.n++;
      }
      const m = a.n ? a.sum / a.n : NaN;
      const n = mean.steps.length;
      if (!n || step > mean.steps[n - 1]) {
        mean.steps.push(step);
        mean.loss.push(m);
      } else {
        const i = lowerBound(mean.steps, step);
        if (mean.steps[i] === step) mean.loss[i] = m;
        else {
          mean.steps.splice(i, 0, step);
          mean.loss.splice(i, 0, m);
        }
      }
    }

    addMarker(step, label, kind) {
      if (this.markers.some((m) => m.step === step && m.label === label)) return;
      this.markers.push({step, label, kind});
      this.request();
    }

    setVisible(key, on) {
      const s = this.series.get(key);
      if (s) s.visible = on;
      this.request();
    }

    /* The visible series as drawn: smoothed copies (raw: the values) when smoothing is on. */
    visible() {
      const vis = this.order.map((k) => this.series.get(k)).filter((s) => s.visible && s.steps.length);
      if (!this.smoothing) return vis;
      return vis.map((s) => Object.assign({}, s, {loss: ema(s.loss, this.smoothing), raw: s.loss}));
    }

    /* The axes' ranges over the visible series. */
    ranges(vis) {
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const s of vis) {
        x0 = Math.min(x0, s.steps[0]);
        x1 = Math.max(x1, s.steps[s.steps.length - 1]);
        for (const v of s.loss) {
          if (!Number.isFinite(v) || (this.log && v <= 0)) continue;
          if (v < y0) y0 = v;
          if (v > y1) y1 = v;
        }
      }
      for (const m of this.markers) {
        if (Number.isFinite(x0)) {
          x0 = Math.min(x0, m.step);
          x1 = Math.max(x1, m.step);
        }
      }
      if (!Number.isFinite(x0)) return null;
      if (x1 === x0) x1 = x0 + 1;
      if (!Number.isFinite(y0)) {
        y0 = this.log ? 0.1 : 0;
        y1 = 1;
      }
      if (this.log) {
        const l0 = Math.log10(y0), l1 = Math.log10(y1);
        const pad = Math.max((l1 - l0) * 0.05, 0.05);
        return {x0, x1, y0: Math.pow(10, l0 - pad), y1: Math.pow(10, l1 + pad)};
      }
      const pad = (y1 - y0) * 0.06 || Math.abs(y1) * 0.1 || 1;
      return {x0, x1, y0: Math.max(y0 >= 0 ? 0 : -Infinity, y0 - pad), y1: y1 + pad};
    }

    draw() {
      const c = this.canvas;
      const {ctx, W, H, fg, grid, mean: meanColor} = beginDraw(this.box, c, 320);
      c.dataset.points = String(this.points());

      const vis = this.visible();
      const R = this.ranges(vis);
      if (!R) {
        ctx.fillStyle = fg;
        ctx.textAlign = 'center';
        ctx.fillText(this.points() ? 'every series is hidden' : 'waiting for the first loss…', W / 2, H / 2);
        this.tip.hidden = true;
        return;
      }
      const pw = W - PAD.left - PAD.right, ph = H - PAD.top - PAD.bottom;
      const X = (s) => PAD.left + ((s - R.x0) / (R.x1 - R.x0)) * pw;
      const ly0 = this.log ? Math.log10(R.y0) : 0, ly1 = this.log ? Math.log10(R.y1) : 0;
      const Y = this.log
        ? (v) => PAD.top + (1 - (Math.log10(v) - ly0) / (ly1 - ly0)) * ph
        : (v) => PAD.top + (1 - (v - R.y0) / (R.y1 - R.y0)) * ph;

      /* grid and axes */
      ctx.strokeStyle = grid;
      ctx.fillStyle = fg;
      ctx.lineWidth = 1;
      const yt = this.log ? logTicks(R.y0, R.y1) : linearTicks(R.y0, R.y1, Math.max(2, Math.floor(ph / 45)));
      yGrid(ctx, yt, Y, PAD, pw);
      ctx.textAlign = 'center';
      ctx.textBaseline = 'top';
      const xt = linearTicks(R.x0, R.x1, Math.max(2, Math.floor(pw / 90))).filter((v) => Number.isInteger(v) || v > 10);
      for (const v of xt) {
        const x = Math.round(X(v)) + 0.5;
        ctx.beginPath();
        ctx.moveTo(x, PAD.top);
        ctx.lineTo(x, PAD.top + ph);
        ctx.stroke();
        ctx.fillText(fmtStep(v, R.x1), x, PAD.top + ph + 6);
      }
      ctx.textAlign = 'left';
      ctx.fillText('step', PAD.left + pw - 22, PAD.top + ph + 18);
      ctx.save();
      ctx.translate(12, PAD.top + ph / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = 'center';
      ctx.textBaseline = 'middle';
      ctx.fillText(this.log ? 'loss (log)' : 'loss', 0, 0);
      ctx.restore();

      /* markers */
      ctx.save();
      ctx.setLineDash([4, 4]);
      ctx.textAlign = 'left';
      ctx.textBaseline = 'top';
      this.markers.forEach((m, i) => {
        const x = Math.round(X(m.step)) + 0.5;
        ctx.strokeStyle = m.kind === 'restart' || m.kind === 'nonfinite' ? '#c92a2a' : '#868e96';
        ctx.beginPath();
        ctx.moveTo(x, PAD.top);
        ctx.lineTo(x, PAD.top + ph);
        ctx.stroke();
        ctx.fillStyle = ctx.strokeStyle;
        const tw = ctx.measureText(m.label).width;
        const tx = x + 4 + tw > PAD.left + pw ? x - 4 - tw : x + 4;
        ctx.fillText(m.label, tx, PAD.top + 2 + (i % 3) * 13);
      });
      ctx.restore();

      /* lines: ranks first, the mean on top */
      ctx.save();
      ctx.beginPath();
      ctx.rect(PAD.left, PAD.top - 1, pw, ph + 2);
      ctx.clip();
      const ordered = vis.filter((s) => s.key !== 'mean').concat(vis.filter((s) => s.key === 'mean'));
      for (const s of ordered) {
        ctx.strokeStyle = s.color || meanColor;
        ctx.globalAlpha = s.key === 'mean' ? 1 : 0.75;
        ctx.lineWidth = s.width;
        ctx.lineJoin = 'round';
        this.line(ctx, s, X, Y, R);
      }
      ctx.restore();

      this.hover(ctx, vis, X, Y, R, pw, ph, meanColor, fg, W);
    }

    /* One series, decimated per pixel column (first, min, max, last). */
    line(ctx, s, X, Y, R) {
      drawLine(ctx, s.steps, s.loss, X, Y, R.x0, this.log);
    }

    hover(ctx, vis, X, Y, R, pw, ph, meanColor, fg, W) {
      const f = this.hoverFraction(PAD, pw);
      if (f === null) return;
      const main = vis.find((s) => s.key === 'mean') || vis[0];
      const i = nearest(main.steps, R.x0 + f * (R.x1 - R.x0));
      if (i < 0) return;
      const step = main.steps[i];
      const x = Math.round(X(step)) + 0.5;
      this.crosshair(ctx, x, PAD, ph, fg);
      const rows = [el('div', {class: 'tip-step'}, 'step ' + fmtInt(step))];
      for (const s of vis) {
        const j = nearest(s.steps, step);
        if (j < 0) continue;
        const v = s.loss[j];
        if (Number.isFinite(v) && (!this.log || v > 0)) {
          ctx.beginPath();
          ctx.fillStyle = s.color || meanColor;
          ctx.arc(X(s.steps[j]), Y(v), s.key === 'mean' ? 3.5 : 2.5, 0, Math.PI * 2);
          ctx.fill();
        }
        const raw = s.raw ? s.raw[j] : v;
        rows.push(el('div', {class: 'tip-row'},
          el('span', {class: 'swatch', style: {background: s.color || meanColor}}),
          s.label + (s.steps[j] !== step ? ` (step ${fmtInt(s.steps[j])})` : '') + ': ',
          el('b', {}, Number.isFinite(v) ? fmtLoss(v) : 'not finite'),
          s.raw && Number.isFinite(raw) ? ` (raw ${fmtLoss(raw)})` : ''));
      }
      for (const m of this.markers) if (Math.abs(X(m.step) - x) < 4) rows.push(el('div', {class: 'tip-marker'}, m.label));
      this.showTip(rows, x, W, PAD.top + 4);
    }
  }

  /* The eval events of a job: loss on the left axis, accuracy (cross_entropy) on the
   * right one, a point per eval. Fed from /metrics' `eval` columns (set) and live eval
   * events (add: a step at or before the last one is a restart's rerun, which replaces
   * the points from there on). */
  class EvalChart extends CanvasChart {
    constructor(container) {
      super(container, 'chart-box eval-box', 'eval-canvas', 'eval chart');
      this.steps = [];
      this.loss = [];
      this.acc = [];
      this.samples = [];
    }

    /* /metrics' eval: {step, loss, accuracy, samples} columns. */
    set(ev) {
      this.steps = [];
      this.loss = [];
      this.acc = [];
      this.samples = [];
      for (let i = 0; ev && i < ev.step.length; i++)
        this.add({step: ev.step[i], loss: ev.loss[i], accuracy: ev.accuracy[i], samples: ev.samples[i]});
      this.request();
    }

    add(ev) {
      const k = lowerBound(this.steps, ev.step);
      for (const a of [this.steps, this.loss, this.acc, this.samples]) a.length = k;
      this.steps.push(ev.step);
      this.loss.push(ev.loss === null || ev.loss === undefined ? NaN : ev.loss);
      this.acc.push(ev.accuracy === null || ev.accuracy === undefined ? NaN : ev.accuracy);
      this.samples.push(ev.samples);
      this.request();
    }

    draw() {
      const c = this.canvas;
      const {ctx, W, H, fg, grid, mean: lossColor} = beginDraw(this.box, c, 260);
      const accColor = '#2f9e44';
      c.dataset.points = String(this.steps.length);
      const n = this.steps.length;
      if (!n) {
        ctx.fillStyle = fg;
        ctx.textAlign = 'center';
        ctx.fillText('waiting for the first eval…', W / 2, H / 2);
        this.tip.hidden = true;
        return;
      }
      const hasAcc = this.acc.some(Number.isFinite);
      const pad = {left: PAD.left, right: hasAcc ? 52 : PAD.right, top: PAD.top, bottom: PAD.bottom};
      const pw = W - pad.left - pad.right, ph = H - pad.top - pad.bottom;
      let x0 = this.steps[0], x1 = this.steps[n - 1];
      if (x1 === x0) {
        x0 -= 1;
        x1 += 1;
      }
      const fin = this.loss.filter(Number.isFinite);
      let y0 = fin.length ? Math.min(...fin) : 0, y1 = fin.length ? Math.max(...fin) : 1;
      const yp = (y1 - y0) * 0.08 || Math.abs(y1) * 0.1 || 1;
      y0 = Math.max(y0 >= 0 ? 0 : -Infinity, y0 - yp);
      y1 += yp;
      const X = (s) => pad.left + ((s - x0) / (x1 - x0)) * pw;
      const Y = (v) => pad.top + (1 - (v - y0) / (y1 - y0)) * ph;
      const A = (v) => pad.top + (1 - v) * ph;

      ctx.strokeStyle = grid;
      ctx.fillStyle = fg;
      ctx.lineWidth = 1;
      yGrid(ctx, linearTicks(y0, y1, Math.max(2, Math.floor(ph / 45))), Y, pad, pw);
      if (hasAcc) {
        ctx.textAlign = 'left';
        ctx.fillStyle = accColor;
        for (const v of [0, 0.25, 0.5, 0.75, 1]) ctx.fillText(Math.round(v * 100) + '%', pad.left + pw + 6, A(v));
      }
      ctx.fillStyle = fg;
      ctx.textAlign = 'center';
      ctx.textBaseline = 'top';
      for (const v of linearTicks(x0, x1, Math.max(2, Math.floor(pw / 90))).filter((v) => Number.isInteger(v))) {
        if (v < this.steps[0] && n > 1) continue;
        ctx.fillText(fmtStep(v, x1), X(v), pad.top + ph + 6);
      }
      ctx.save();
      ctx.translate(12, pad.top + ph / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = 'center';
      ctx.textBaseline = 'middle';
      ctx.fillStyle = lossColor;
      ctx.fillText('eval loss', 0, 0);
      ctx.restore();

      const series = [[this.loss, Y, lossColor]];
      if (hasAcc) series.push([this.acc, A, accColor]);
      for (const [vals, F, color] of series) {
        ctx.strokeStyle = color;
        ctx.fillStyle = color;
        ctx.lineWidth = 2;
        ctx.beginPath();
        let pen = false;
        for (let i = 0; i < n; i++) {
          if (!Number.isFinite(vals[i])) {
            pen = false;
            continue;
          }
          if (pen) ctx.lineTo(X(this.steps[i]), F(vals[i]));
          else ctx.moveTo(X(this.steps[i]), F(vals[i]));
          pen = true;
        }
        ctx.stroke();
        for (let i = 0; i < n; i++) {
          if (!Number.isFinite(vals[i])) continue;
          ctx.beginPath();
          ctx.arc(X(this.steps[i]), F(vals[i]), 2.5, 0, Math.PI * 2);
          ctx.fill();
        }
      }

      const f = this.hoverFraction(pad, pw);
      if (f === null) return;
      const i = nearest(this.steps, x0 + f * (x1 - x0));
      const x = Math.round(X(this.steps[i])) + 0.5;
      this.crosshair(ctx, x, pad, ph, fg);
      const rows = [el('div', {class: 'tip-step'}, 'eval at step ' + fmtInt(this.steps[i])),
        el('div', {class: 'tip-row'}, el('span', {class: 'swatch', style: {background: lossColor}}), 'loss: ',
          el('b', {}, Number.isFinite(this.loss[i]) ? fmtLoss(this.loss[i]) : 'not finite'))];
      if (Number.isFinite(this.acc[i]))
        rows.push(el('div', {class: 'tip-row'}, el('span', {class: 'swatch', style: {background: accColor}}),
          'accuracy: ', el('b', {}, (this.acc[i] * 100).toFixed(2) + '%')));
      rows.push(el('div', {class: 'tip-row'}, 'samples: ', el('b', {}, fmtInt(this.samples[i]))));
      this.showTip(rows, x, W, pad.top + 4);
    }
  }

  /* Lines of any number of series against a shared x axis (step, samples seen or wall
   * time): the job page's lr and gradient-norm charts and the compare page's overlaid
   * curves. Each series is {key, label, color, xs, ys} (xs ascending); smoothing as the
   * loss chart's, a linear or log y axis, a read-out of every series at the pointer, and
   * dots for series of points (the eval curves). Fed whole (setSeries) or a point at a
   * time (addPoint: an x at or before the last one cuts the series back, as a restart). */
  class LineChart extends CanvasChart {
    constructor(container, {name, yLabel, xLabel = 'step', height = 220, dots = false, fmtY = fmtLoss} = {}) {
      super(container, 'chart-box line-box', 'line-canvas', (name || yLabel) + ' chart');
      this.canvas.dataset.chart = name || yLabel;
      this.yLabel = yLabel;
      this.xLabel = xLabel;
      this.height = height;
      this.dots = dots;
      this.fmtY = fmtY;
      this.fmtX = null; /* how the read-out and the ticks show an x: null for steps */
      this.list = [];
      this.log = false;
      this.smoothing = 0;
    }

    setSeries(list) {
      this.list = list.map((s) => Object.assign({visible: true}, s));
      this.request();
    }

    addPoint(key, label, color, x, y) {
      let s = this.list.find((t) => t.key === key);
      if (!s) {
        s = {key, label, color, xs: [], ys: [], visible: true};
        this.list.push(s);
      }
      const k = lowerBound(s.xs, x);
      s.xs.length = k;
      s.ys.length = k;
      s.xs.push(x);
      s.ys.push(y === null || y === undefined ? NaN : y);
      this.request();
    }

    setAxis(xLabel, fmtX) {
      this.xLabel = xLabel;
      this.fmtX = fmtX || null;
      this.request();
    }

    points() {
      let n = 0;
      for (const s of this.list) n += s.xs.length;
      return n;
    }

    draw() {
      const c = this.canvas;
      const {ctx, W, H, fg, grid} = beginDraw(this.box, c, this.height);
      c.dataset.points = String(this.points());
      c.dataset.series = String(this.list.filter((s) => s.xs.length).length);
      const vis = this.list.filter((s) => s.visible && s.xs.length)
        .map((s) => (this.smoothing && !this.dots ? Object.assign({}, s, {ys: ema(s.ys, this.smoothing), raw: s.ys}) : s));
      c.dataset.visible = String(vis.length);
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const s of vis) {
        x0 = Math.min(x0, s.xs[0]);
        x1 = Math.max(x1, s.xs[s.xs.length - 1]);
        for (const v of s.ys) {
          if (!Number.isFinite(v) || (this.log && v <= 0)) continue;
          if (v < y0) y0 = v;
          if (v > y1) y1 = v;
        }
      }
      if (!Number.isFinite(x0) || !Number.isFinite(y0)) {
        ctx.fillStyle = fg;
        ctx.textAlign = 'center';
        ctx.fillText('no ' + this.yLabel + ' recorded', W / 2, H / 2);
        this.tip.hidden = true;
        return;
      }
      if (x1 === x0) x1 = x0 + 1;
      if (this.log) {
        const l0 = Math.log10(y0), l1 = Math.log10(y1), p = Math.max((l1 - l0) * 0.05, 0.05);
        y0 = Math.pow(10, l0 - p);
        y1 = Math.pow(10, l1 + p);
      } else {
        const p = (y1 - y0) * 0.06 || Math.abs(y1) * 0.1 || 1;
        y0 = Math.max(y0 >= 0 ? 0 : -Infinity, y0 - p);
        y1 += p;
      }
      const pw = W - PAD.left - PAD.right, ph = H - PAD.top - PAD.bottom;
      const X = (x) => PAD.left + ((x - x0) / (x1 - x0)) * pw;
      const ly0 = Math.log10(y0), ly1 = Math.log10(y1);
      const Y = this.log ? (v) => PAD.top + (1 - (Math.log10(v) - ly0) / (ly1 - ly0)) * ph
        : (v) => PAD.top + (1 - (v - y0) / (y1 - y0)) * ph;
      const fx = this.fmtX || ((v) => fmtStep(v, x1));

      ctx.strokeStyle = grid;
      ctx.fillStyle = fg;
      ctx.lineWidth = 1;
      yGrid(ctx, this.log ? logTicks(y0, y1) : linearTicks(y0, y1, Math.max(2, Math.floor(ph / 45))), Y, PAD, pw);
      ctx.textAlign = 'center';
      ctx.textBaseline = 'top';
      for (const v of linearTicks(x0, x1, Math.max(2, Math.floor(pw / 90)))) {
        const x = Math.round(X(v)) + 0.5;
        ctx.beginPath();
        ctx.moveTo(x, PAD.top);
        ctx.lineTo(x, PAD.top + ph);
        ctx.stroke();
        ctx.fillText(fx(v), x, PAD.top + ph + 6);
      }
      ctx.textAlign = 'right';
      ctx.fillText(this.xLabel, PAD.left + pw, PAD.top + ph + 18);
      ctx.save();
      ctx.translate(12, PAD.top + ph / 2);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = 'center';
      ctx.textBaseline = 'middle';
      ctx.fillText(this.log ? this.yLabel + ' (log)' : this.yLabel, 0, 0);
      ctx.restore();

      ctx.save();
      ctx.beginPath();
      ctx.rect(PAD.left, PAD.top - 1, pw, ph + 2);
      ctx.clip();
      ctx.lineWidth = 1.75;
      ctx.lineJoin = 'round';
      for (const s of vis) {
        ctx.strokeStyle = s.color;
        drawLine(ctx, s.xs, s.ys, X, Y, x0, this.log);
        if (this.dots) {
          ctx.fillStyle = s.color;
          for (let i = 0; i < s.xs.length; i++) {
            if (!Number.isFinite(s.ys[i]) || (this.log && s.ys[i] <= 0)) continue;
            ctx.beginPath();
            ctx.arc(X(s.xs[i]), Y(s.ys[i]), 2.5, 0, Math.PI * 2);
            ctx.fill();
          }
        }
      }
      ctx.restore();

      const f = this.hoverFraction(PAD, pw);
      if (f === null) return;
      const at = x0 + f * (x1 - x0);
      const x = Math.round(X(at)) + 0.5;
      this.crosshair(ctx, x, PAD, ph, fg);
      const rows = [el('div', {class: 'tip-step'}, this.xLabel + ' ' + (this.fmtX ? this.fmtX(at) : fmtInt(Math.round(at))))];
      for (const s of vis) {
        const j = nearest(s.xs, at);
        const v = s.ys[j], raw = s.raw ? s.raw[j] : v;
        rows.push(el('div', {class: 'tip-row'}, el('span', {class: 'swatch', style: {background: s.color}}),
          s.label + ': ', el('b', {}, Number.isFinite(v) ? this.fmtY(v) : 'not finite'),
          s.raw && Number.isFinite(raw) ? ` (raw ${this.fmtY(raw)})` : ''));
      }
      this.showTip(rows, x, W, PAD.top + 4);
    }
  }

  ddpd.LossChart = LossChart;
  ddpd.LineChart = LineChart;
  ddpd.EvalChart = EvalChart;
  ddpd.chartEma = ema;
  ddpd.chartPalette = PALETTE;
})();
