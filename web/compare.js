/* compare.js — jobs side by side: their loss, eval loss, eval accuracy, lr and gradient
 * norm overlaid (one colour per job, one legend for all the charts), against steps,
 * samples seen or wall time, with smoothing; a table of each job's final and best metrics
 * (the server's `metrics` of each job); and the spec fields in which the jobs differ, and
 * only those (the specs flattened to dotted paths).
 *
 * ddpd.compare.mount(root, ids) draws it into any element, so another page (a sweep's
 * top trials) shows the same view; ddpd.views.compare is the #/compare?ids=3,5,9 page.
 * Reads only: GET /v1/jobs/{id} and GET /v1/jobs/{id}/metrics of each job. */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});
  const U = ddpd.util, api = ddpd.api;
  const {el, fill} = U;

  /* At most this many jobs on one page (each is two requests and a colour). */
  const MAX_JOBS = 50;
  const SMOOTH_KEY = 'ddpd.compareSmoothing';
  const pct = (v) => (v * 100).toFixed(2) + '%';

  /* "3,5,9" -> [3, 5, 9]: positive integers, each once, in the order given. */
  function parseIds(text) {
    const out = [];
    for (const part of String(text || '').split(',')) {
      const t = part.trim();
      if (/^[1-9][0-9]{0,15}$/.test(t) && !out.includes(Number(t))) out.push(Number(t));
    }
    return out.slice(0, MAX_JOBS);
  }

  /* A spec as {dotted path: JSON text of the value}: objects' keys joined with '.',
   * array items as [i] (model[2].out); an empty object or array is a value of its own. */
  function flatten(v, prefix, out) {
    if (Array.isArray(v) && v.length) v.forEach((x, i) => flatten(x, `${prefix}[${i}]`, out));
    else if (v && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length) {
      for (const [k, x] of Object.entries(v)) flatten(x, prefix ? `${prefix}.${k}` : k, out);
    } else out[prefix] = JSON.stringify(v);
    return out;
  }

  /* The paths whose values are not the same in every spec (a path missing from some is
   * one of them), sorted: [{path, values: [text or undefined per spec]}]. */
  function differing(specs) {
    const flat = specs.map((s) => flatten(s || {}, '', {}));
    const paths = new Set();
    for (const f of flat) for (const p of Object.keys(f)) paths.add(p);
    const out = [];
    for (const p of Array.from(paths).sort()) {
      const values = flat.map((f) => (Object.prototype.hasOwnProperty.call(f, p) ? f[p] : undefined));
      if (values.some((v) => v !== values[0])) out.push({path: p, values});
    }
    return out;
  }

  /* Samples the job's ranks take per optimizer step, as written in its spec: batch_size ×
   * grad_accum × world_size (a shorter last batch of an epoch counts as whole). */
  function samplesPerStep(job) {
    const s = job.spec || {};
    return (s.batch_size || 1) * (s.grad_accum || 1) * (job.world_size || 1);
  }

  /* y at x by linear interpolation over ascending xs (clamped at the ends). */
  function interp(xs, ys, x) {
    const n = xs.length;
    if (!n) return NaN;
    if (x <= xs[0]) return ys[0];
    if (x >= xs[n - 1]) return ys[n - 1];
    let lo = 0, hi = n - 1;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (xs[mid] <= x) lo = mid;
      else hi = mid;
    }
    return ys[lo] + ((ys[hi] - ys[lo]) * (x - xs[lo])) / (xs[hi] - xs[lo]);
  }

  const nums = (a) => (a || []).map((v) => (v === null ? NaN : v));

  /* The curves, each from a job's /metrics. */
  const CURVES = [
    {key: 'loss', label: 'loss', log: true, get: (m) => m.mean && {xs: m.mean.step, ys: m.mean.loss}},
    {key: 'eval_loss', label: 'eval loss', dots: true, get: (m) => m.eval && {xs: m.eval.step, ys: m.eval.loss}},
    {key: 'eval_accuracy', label: 'eval accuracy', dots: true, fmtY: pct,
      get: (m) => m.eval && {xs: m.eval.step, ys: m.eval.accuracy}},
    {key: 'lr', label: 'lr', get: (m) => m.lr && {xs: m.lr.step, ys: m.lr.lr}},
    {key: 'grad_norm', label: 'gradient norm', get: (m) => m.grad_norm && {xs: m.grad_norm.step, ys: m.grad_norm.grad_norm}},
  ];

  const AXES = {
    step: {label: 'step', fmt: null},
    samples: {label: 'samples seen', fmt: (v) => (Math.abs(v) >= 1e6 ? Number((v / 1e6).toPrecision(4)) + 'M'
      : Math.abs(v) >= 1e4 ? Number((v / 1e3).toPrecision(4)) + 'k' : String(Math.round(v)))},
    time: {label: 'wall time', fmt: (v) => U.fmtDuration(v)},
  };

  /* A step of `job` on the axis `axis` (NaN where it cannot be placed). */
  function xOf(axis, job, m) {
    if (axis === 'samples') {
      const k = samplesPerStep(job);
      return (step) => step * k;
    }
    if (axis === 'time') {
      const ts = (m.time && m.time.step) || [], tv = (m.time && m.time.time) || [];
      const t0 = job.started_at || tv[0];
      return (step) => (ts.length ? interp(ts, tv, step) - t0 : NaN);
    }
    return (step) => step;
  }

  /* Draws the comparison of `ids` into root. Returns unmount(). opts.maxPoints: the
   * points per series asked of /metrics. When drawn, root.dataset.renderMs holds the
   * milliseconds from the data's arrival to the charts and tables drawn, and
   * root.dataset.fetchMs those of the requests before it. */
  function mount(root, ids, opts = {}) {
    const maxPoints = opts.maxPoints || 1000;
    let gone = false;
    const charts = [];
    const status = el('p', {class: 'muted', id: 'compare-status'}, `Loading ${ids.length} jobs…`);
    const axisSel = el('select', {id: 'compare-x'},
      Object.entries(AXES).map(([k, a]) => el('option', {value: k}, a.label)));
    const smoothBox = el('input', {type: 'range', id: 'compare-smoothing', min: '0', max: '0.99', step: '0.01', value: '0'});
    const smoothVal = el('span', {class: 'muted'}, '0');
    const legend = el('div', {class: 'compare-legend', id: 'compare-legend'});
    const grid = el('div', {class: 'compare-charts', id: 'compare-charts'});
    const table = el('div', {class: 'table-wrap', id: 'compare-metrics-wrap'});
    const diff = el('div', {class: 'table-wrap', id: 'compare-diff-wrap'});
    fill(root, status,
      el('div', {class: 'card-head compare-controls'},
        el('label', {class: 'check'}, 'x axis ', axisSel),
        el('label', {class: 'check smoothing', title: 'exponential moving average of the lines, as TensorBoard\'s'},
          'smoothing ', smoothBox, ' ', smoothVal),
        el('span', {class: 'grow'})),
      legend, grid,
      el('section', {class: 'card'}, el('h2', {}, 'Final and best metrics'), table),
      el('section', {class: 'card'}, el('h2', {}, 'Spec fields that differ'), diff));
    try {
      smoothBox.value = localStorage.getItem(SMOOTH_KEY) || '0';
    } catch (e) { /* ignore */ }
    fill(smoothVal, Number(smoothBox.value).toFixed(2));

    let runs = []; /* {job, m, color, visible} */

    function seriesOf(curve) {
      const axis = axisSel.value;
      const out = [];
      for (const r of runs) {
        const c = curve.get(r.m);
        if (!c || !c.xs || !c.xs.length) continue;
        const ys = nums(c.ys);
        if (!ys.some(Number.isFinite)) continue;
        const fx = xOf(axis, r.job, r.m);
        const xs = [], yv = [];
        for (let i = 0; i < c.xs.length; i++) {
          const x = fx(c.xs[i]);
          if (!Number.isFinite(x) || (xs.length && x < xs[xs.length - 1])) continue;
          xs.push(x);
          yv.push(ys[i]);
        }
        out.push({key: 'j' + r.job.id, label: `#${r.job.id} ${r.job.name || ''}`.trim(), color: r.color,
          xs, ys: yv, visible: r.visible});
      }
      return out;
    }

    function drawCharts() {
      const axis = AXES[axisSel.value];
      for (const {chart, curve, card} of charts) {
        const list = seriesOf(curve);
        card.hidden = !list.length;
        chart.setAxis(axis.label, axis.fmt);
        chart.setSmoothing(smoothBox.value);
        chart.setSeries(list);
        if (!card.hidden) chart.draw(); /* now, not at the next frame: the timing counts it */
      }
    }

    function metricCell(v, fmt, step) {
      if (v === null || v === undefined) return el('td', {class: 'num mono'}, '—');
      return el('td', {class: 'num mono'}, fmt(v), step !== undefined && step !== null
        ? el('span', {class: 'muted'}, ` (step ${U.fmtInt(step)})`) : null);
    }

    function renderTable() {
      const acc = runs.some((r) => r.job.metrics && r.job.metrics.best_eval_accuracy !== null &&
        r.job.metrics.best_eval_accuracy !== undefined);
      const head = ['Job', 'State', 'Step', 'Loss', 'Eval loss', 'Best eval loss'].concat(acc ? ['Eval accuracy', 'Best eval accuracy'] : []);
      fill(table, el('table', {class: 'jobs compare-metrics', id: 'compare-metrics'},
        el('thead', {}, el('tr', {}, head.map((h, i) => el('th', {class: i > 1 ? 'num' : ''}, h)))),
        el('tbody', {}, runs.map((r) => {
          const m = r.job.metrics || {};
          return el('tr', {dataset: {jobId: r.job.id}},
            el('td', {}, el('span', {class: 'swatch', style: {background: r.color}}), ' ',
              el('a', {href: '#/jobs/' + r.job.id}, `#${r.job.id}`), ' ', r.job.name || ''),
            el('td', {}, U.stateBadge(r.job.state)),
            el('td', {class: 'num mono'}, U.fmtInt(m.step)),
            el('td', {class: 'num mono'}, U.lossCell(m.loss, r.job.loss_nonfinite)),
            metricCell(m.eval_loss, U.fmtLoss, m.eval_step),
            metricCell(m.best_eval_loss, U.fmtLoss, m.best_eval_loss_step),
            acc ? metricCell(m.eval_accuracy, pct, m.eval_step) : null,
            acc ? metricCell(m.best_eval_accuracy, pct, m.best_eval_accuracy_step) : null);
        }))));
    }

    function renderDiff() {
      const rows = differing(runs.map((r) => r.job.spec));
      if (!rows.length) {
        fill(diff, el('p', {class: 'muted', id: 'compare-diff-none'}, 'The specs are the same.'));
        return;
      }
      fill(diff, el('table', {class: 'jobs compare-diff', id: 'compare-diff'},
        el('thead', {}, el('tr', {}, el('th', {}, 'Field'),
          runs.map((r) => el('th', {}, el('span', {class: 'swatch', style: {background: r.color}}), ` #${r.job.id}`)))),
        el('tbody', {}, rows.map((d) => el('tr', {dataset: {path: d.path}},
          el('td', {class: 'mono'}, d.path),
          d.values.map((v) => el('td', {class: 'mono'}, v === undefined ? el('span', {class: 'muted'}, '(not set)') : v)))))));
    }

    function renderLegend() {
      fill(legend, runs.map((r) => {
        const cb = el('input', {type: 'checkbox', checked: r.visible, dataset: {jobId: r.job.id}});
        cb.addEventListener('change', () => {
          r.visible = cb.checked;
          drawCharts();
        });
        return el('label', {class: 'check series-toggle', dataset: {jobId: r.job.id}}, cb,
          el('span', {class: 'swatch', style: {background: r.color}}), `#${r.job.id} ${r.job.name || ''}`);
      }));
    }

    for (const curve of CURVES) {
      const host = el('div', {class: 'chart-host'});
      const card = el('section', {class: 'card compare-chart', dataset: {curve: curve.key}, hidden: true},
        el('h2', {}, curve.label), host);
      grid.appendChild(card);
      const chart = new ddpd.LineChart(host, {name: curve.key, yLabel: curve.label, dots: curve.dots, fmtY: curve.fmtY});
      chart.setLog(!!curve.log);
      charts.push({chart, curve, card});
    }
    axisSel.addEventListener('change', drawCharts);
    smoothBox.addEventListener('input', () => {
      fill(smoothVal, Number(smoothBox.value).toFixed(2));
      try {
        localStorage.setItem(SMOOTH_KEY, smoothBox.value);
      } catch (e) { /* ignore */ }
      drawCharts();
    });

    (async () => {
      const t0 = performance.now();
      const got = await Promise.all(ids.map((id) => Promise.all([api.get('/v1/jobs/' + id),
        api.get(`/v1/jobs/${id}/metrics?max_points=${maxPoints}`)]).catch((e) => ({id, e}))));
      if (gone) return;
      const t1 = performance.now();
      const failed = got.filter((g) => !Array.isArray(g));
      runs = got.filter(Array.isArray).map(([job, m], i) => ({job, m, visible: true,
        color: ddpd.chartPalette[i % ddpd.chartPalette.length]}));
      fill(status, failed.length
        ? el('div', {class: 'notice notice-error', role: 'alert'},
          failed.map((f) => `job ${f.id}: ${f.e.message || f.e}`).join('; '))
        : null);
      renderLegend();
      drawCharts();
      renderTable();
      renderDiff();
      root.dataset.fetchMs = (t1 - t0).toFixed(1);
      root.dataset.renderMs = (performance.now() - t1).toFixed(1);
      root.dataset.jobs = String(runs.length);
    })().catch((e) => {
      if (!gone) fill(status, el('div', {class: 'notice notice-error', role: 'alert'}, e.message || String(e)));
    });

    return () => {
      gone = true;
      for (const {chart} of charts) chart.destroy();
    };
  }

  /* #/compare?ids=3,5,9 */
  function compareView(root, params) {
    const ids = parseIds(params.get('ids'));
    const body = el('div', {id: 'compare'});
    fill(root, el('a', {class: 'back', href: '#/jobs'}, '← Jobs'),
      el('div', {class: 'page-head'}, el('h1', {}, 'Compare ', ids.map((id) => '#' + id).join(', '))), body);
    document.title = 'Compare — ddpd';
    if (!ids.length) {
      fill(body, el('p', {class: 'empty'}, 'No jobs to compare: select them in the ',
        el('a', {href: '#/jobs'}, 'job list'), ', or open ', el('code', {}, '#/compare?ids=3,5,9'), '.'));
      return () => {};
    }
    return mount(body, ids);
  }

  ddpd.compare = {mount, parseIds, flatten, differing};
  ddpd.views = ddpd.views || {};
  ddpd.views.compare = compareView;
})();
