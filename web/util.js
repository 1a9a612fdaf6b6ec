/* util.js — small helpers shared by the dashboard's scripts: DOM building, formatting,
 * and what a job's spec says about its length.
 *
 * The dashboard's scripts are classic deferred scripts, not ES modules (Chromium refuses
 * module scripts on file:// pages, and the page must work opened from disk); each adds
 * its part to the one global `window.ddpd`. */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});

  /* el('a', {href: '#/jobs', class: 'x', onclick: fn, dataset: {k: v}}, 'text', child, ...)
   * Text children become text nodes: data from the server never goes through innerHTML. */
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'dataset') Object.assign(e.dataset, v);
      else if (k === 'style' && typeof v === 'object') Object.assign(e.style, v);
      else if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
      else if (v === true) e.setAttribute(k, '');
      else e.setAttribute(k, String(v));
    }
    append(e, children);
    return e;
  }

  function append(e, children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function clear(e) {
    while (e.firstChild) e.removeChild(e.firstChild);
    return e;
  }

  /* Replaces the children of `e`. */
  function fill(e, ...children) {
    return append(clear(e), children);
  }

  const FINAL = new Set(['succeeded', 'failed', 'cancelled']);
  const STATES = ['queued', 'starting', 'running', 'succeeded', 'failed', 'cancelled', 'preempted'];

  function isFinal(state) {
    return FINAL.has(state);
  }

  function stateBadge(state) {
    return el('span', {class: 'state state-' + state, dataset: {state}}, state);
  }

  /* A loss: 4 significant digits, exponent form when small or large. */
  function fmtLoss(v) {
    if (v === null || v === undefined) return '—';
    if (!Number.isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3);
    return String(Number(v.toPrecision(4)));
  }

  /* A loss for a table cell: a non-finite one (the API's loss_nonfinite, an event's
   * nonfinite) is marked in red rather than shown as a dash. */
  function lossCell(v, nonfinite) {
    if (nonfinite) {
      return el('span', {class: 'loss-nonfinite', title: 'the loss is NaN or infinite: training diverged'},
        '\u26a0 NaN/\u221e');
    }
    return fmtLoss(v);
  }

  function fmtInt(v) {
    if (v === null || v === undefined) return '—';
    return Number(v).toLocaleString('en-US');
  }

  function fmtRate(v) {
    if (v === null || v === undefined || !Number.isFinite(v)) return '—';
    if (v >= 1e6) return (v / 1e6).toFixed(2) + 'M';
    if (v >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    return v.toFixed(1);
  }

  /* Seconds as "42s", "3m 05s", "2h 14m", "3d 4h". */
  function fmtDuration(s) {
    if (s === null || s === undefined || !Number.isFinite(s)) return '—';
    s = Math.max(0, s);
    if (s < 10) return s.toFixed(1) + 's';
    if (s < 60) return Math.round(s) + 's';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + String(Math.floor(s % 60)).padStart(2, '0') + 's';
    const h = Math.floor(m / 60);
    if (h < 24) return h + 'h ' + String(m % 60).padStart(2, '0') + 'm';
    return Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
  }

  function now() {
    return Date.now() / 1000;
  }

  function fmtAge(ts) {
    if (!ts) return '—';
    const s = now() - ts;
    if (s < 5) return 'just now';
    return fmtDuration(s) + ' ago';
  }

  function fmtTime(ts) {
    if (!ts) return '—';
    const d = new Date(ts * 1000);
    const p = (n) => String(n).padStart(2, '0');
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  }

  /* How long a job ran (or has been running). */
  function jobDuration(job) {
    if (!job.started_at) return null;
    return (job.finished_at || now()) - job.started_at;
  }

  /* Micro-batches per epoch of the rank with the most, from the spec when the data is
   * synthetic (rank r takes samples r, r+W, ...: rank 0 has the most); null otherwise. */
  function batchesFromSpec(spec) {
    if (!spec || !spec.data || spec.data.type !== 'synthetic' || !spec.batch_size) return null;
    const w = spec.world_size || 1;
    const n = Math.ceil(spec.data.samples / w);
    return spec.data.drop_last ? Math.floor(n / spec.batch_size) : Math.ceil(n / spec.batch_size);
  }

  /* The job's optimizer steps in all: `steps`, or epochs × steps per epoch of the rank with
   * the most batches (`batches`, from the start events, or known from the spec). */
  function totalSteps(spec, batches) {
    if (!spec) return null;
    if (spec.steps) return spec.steps;
    const nb = batches || batchesFromSpec(spec);
    if (!nb || !spec.epochs) return null;
    return spec.epochs * Math.ceil(nb / (spec.grad_accum || 1));
  }

  /* A progress bar with "step / total" (or just the step when the total is unknown). */
  function progress(step, total, state) {
    const done = state === 'succeeded';
    let frac = null;
    if (total) frac = Math.min(1, (step || 0) / total);
    if (done) frac = 1;
    const label = step === null || step === undefined
      ? (total ? '0 / ' + fmtInt(total) : '—')
      : fmtInt(step) + (total ? ' / ' + fmtInt(total) : '');
    const bar = el('div', {class: 'bar' + (frac === null ? ' bar-unknown' : '') + ' bar-' + state},
      el('div', {class: 'bar-fill', style: {width: frac === null ? '100%' : (frac * 100).toFixed(1) + '%'}}));
    return el('div', {class: 'progress', title: frac === null ? 'total steps not known yet' : (frac * 100).toFixed(1) + '%'},
      bar, el('span', {class: 'progress-label'}, label));
  }

  /* Runs fn now and every `ms` while the page is visible; returns a stop function. */
  function every(ms, fn) {
    let t = null, stopped = false;
    const tick = async () => {
      t = null;
      if (stopped) return;
      if (document.visibilityState !== 'hidden') {
        try {
          await fn();
        } catch (e) {
          /* shown by the caller or the connection banner */
        }
      }
      if (!stopped) t = setTimeout(tick, ms);
    };
    const vis = () => {
      if (document.visibilityState === 'visible' && t !== null) {
        clearTimeout(t);
        tick();
      }
    };
    document.addEventListener('visibilitychange', vis);
    tick();
    return () => {
      stopped = true;
      if (t !== null) clearTimeout(t);
      document.removeEventListener('visibilitychange', vis);
    };
  }

  /* A short message at the bottom of the page. */
  function toast(text, kind) {
    const box = document.getElementById('toasts');
    if (!box) return;
    const t = el('div', {class: 'toast' + (kind ? ' toast-' + kind : ''), role: 'status'}, text);
    box.appendChild(t);
    setTimeout(() => t.classList.add('toast-out'), 4000);
    setTimeout(() => t.remove(), 4600);
  }

  /* Asks a yes/no question in the page's confirmation dialog; resolves true or false. */
  function confirmDialog(title, text, yes) {
    const d = document.getElementById('confirm-dialog');
    fill(d.querySelector('.confirm-title'), title);
    fill(d.querySelector('.confirm-text'), text);
    d.querySelector('.confirm-yes').textContent = yes || 'OK';
    return new Promise((resolve) => {
      const done = () => {
        d.removeEventListener('close', done);
        resolve(d.returnValue === 'yes');
      };
      d.returnValue = '';
      d.addEventListener('close', done);
      d.showModal();
    });
  }

  const fmtPct = (v) => (v * 100).toFixed(2) + '%';
  const has = (v) => v !== null && v !== undefined;

  /* A job's final and best eval (the server's `metrics`, docs/api.md "Job metrics") as
   * text: {final, best}, each null when there is none. A classifier's are its accuracy
   * beside the loss. */
  function evalText(m) {
    if (!m) return {final: null, best: null};
    const at = (step) => ` (step ${fmtInt(step)})`;
    const final = has(m.eval_step) ? [has(m.eval_loss) ? 'loss ' + fmtLoss(m.eval_loss) : 'loss not finite',
      has(m.eval_accuracy) ? 'accuracy ' + fmtPct(m.eval_accuracy) : null].filter(Boolean).join(' · ') + at(m.eval_step) : null;
    const best = [has(m.best_eval_loss) ? 'loss ' + fmtLoss(m.best_eval_loss) + at(m.best_eval_loss_step) : null,
      has(m.best_eval_accuracy) ? 'accuracy ' + fmtPct(m.best_eval_accuracy) + at(m.best_eval_accuracy_step) : null]
      .filter(Boolean).join(' · ') || null;
    return {final, best};
  }

  /* The job list's Eval cell: the best eval accuracy of a classifier, else the best eval
   * loss, with the final one under it. */
  function evalCell(m) {
    const t = evalText(m);
    if (!m || !t.final) return el('td', {class: 'num mono eval-cell'}, '—');
    const acc = has(m.best_eval_accuracy);
    const best = acc ? fmtPct(m.best_eval_accuracy) : has(m.best_eval_loss) ? fmtLoss(m.best_eval_loss) : '—';
    const final = acc ? (has(m.eval_accuracy) ? fmtPct(m.eval_accuracy) : '—') : has(m.eval_loss) ? fmtLoss(m.eval_loss) : '—';
    return el('td', {class: 'num mono eval-cell', title: `best: ${t.best || '—'}; final: ${t.final}`,
      dataset: {best: acc ? 'accuracy' : 'loss'}},
      el('span', {class: 'eval-best'}, (acc ? 'acc ' : '') + best),
      el('div', {class: 'sub'}, 'final ' + final));
  }

  /* An API error (or any thrown thing) as the page's alert box. */
  function errorBox(e) {
    return el('div', {class: 'notice notice-error', role: 'alert'}, e.message || String(e));
  }

  ddpd.util = {
    el, append, clear, fill, errorBox, isFinal, STATES, stateBadge, fmtLoss, lossCell, fmtInt, fmtRate, fmtDuration,
    fmtAge, fmtTime, jobDuration, batchesFromSpec, totalSteps, progress, every, toast, confirmDialog, now,
    evalText, evalCell,
  };
})();
