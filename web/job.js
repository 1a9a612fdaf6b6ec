/* job.js — one job's page: its state, progress and final and best eval, the loss chart
 * (with smoothing and the current lr), the eval chart (loss and accuracy of the eval
 * events), the lr and gradient-norm charts, the model put to use
 * (a GPT's Sample box, a classifier's Predictions: sample.js), the ranks, the spec,
 * the tail of each rank's log, the restarts (attempt, time, failed rank, message), the
 * preemptions (when, by which job, the step it resumed from, the steps a forced stop lost),
 * its owner and priority, and the buttons (cancel, preempt, checkpoint, resume, resubmit,
 * delete), those the caller's role or ownership does not allow hidden (app.js, ddpd.may).
 *
 * Where the chart's points come from:
 *   - a finished job: /metrics, downsampled by the server (a million steps open at once),
 *     and, when its history is short, the event stream as well for the markers (joins,
 *     restarts) and each rank's batches;
 *   - a job still going with a short history: the event stream from its first event;
 *   - a job still going with a long history: /metrics for the past, then the stream from
 *     a sequence number that /metrics is sure to cover (loss events of those steps are
 *     recognised as repeats). */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});
  const U = ddpd.util, api = ddpd.api;
  const {el, fill} = U;

  /* Up to this many events (world size × steps / log_every) the lines are drawn from the
   * event stream; beyond it from /metrics. */
  const LINES_FROM_EVENTS = 20000;
  /* Up to this many, the history is streamed anyway for the markers (joins, restarts);
   * beyond it only a running job's recent events are, and older markers are not shown. */
  const MARKERS_FROM_EVENTS = 200000;
  const LOG_KEY = 'ddpd.logScale';
  const SMOOTH_KEY = 'ddpd.smoothing';

  function jobView(root, params, id) {
    let job = null, chart = null, stream = null, stopPoll = null, stopLogs = null, gone = false;
    let attemptSeen = 0, logRank = 0, slots = null, streamStatus = '';
    const batches = new Map();
    const toggles = el('div', {class: 'series-toggles', id: 'series-toggles'});
    const logBox = el('input', {type: 'checkbox', id: 'log-scale'});
    const pill = el('span', {class: 'pill', id: 'stream-status'});
    const chartHost = el('div', {class: 'chart-host'});
    const evalHost = el('div', {class: 'chart-host', id: 'eval-host'});
    const lrHost = el('div', {class: 'chart-host', id: 'lr-host'});
    const gnHost = el('div', {class: 'chart-host', id: 'grad-norm-host'});
    const smoothBox = el('input', {type: 'range', id: 'smoothing', min: '0', max: '0.99', step: '0.01', value: '0'});
    const smoothVal = el('span', {class: 'muted', id: 'smoothing-value'}, '0');
    const lrNow = el('span', {class: 'muted lr-now', id: 'lr-now'});
    let lrStep = 0, evalCard = null, infer = null;
    const inferHost = el('div', {id: 'infer-host'});
    const head = el('div', {class: 'page-head job-head'});
    const notices = el('div');
    const summary = el('dl', {class: 'summary'});
    const rankBody = el('tbody');
    const specPre = el('pre', {class: 'spec mono', id: 'job-spec'});
    const logPre = el('pre', {class: 'log mono', id: 'job-log'});
    const logTabs = el('div', {class: 'tabs'});

    fill(root,
      el('a', {class: 'back', href: '#/jobs'}, '← Jobs'),
      head, notices, summary,
      el('section', {class: 'card'},
        el('div', {class: 'card-head'}, el('h2', {}, 'Loss'), toggles, el('span', {class: 'grow'}), lrNow,
          el('label', {class: 'check smoothing', title: 'exponential moving average of the lines, as TensorBoard\'s'},
            'smoothing ', smoothBox, ' ', smoothVal),
          el('label', {class: 'check'}, logBox, ' log scale'), pill),
        chartHost),
      evalCard = el('section', {class: 'card', id: 'eval-card', hidden: true},
        el('div', {class: 'card-head'}, el('h2', {}, 'Evaluation'),
          el('span', {class: 'muted'}, 'loss (left axis) and accuracy (right axis) on the eval data')),
        evalHost),
      el('section', {class: 'card', id: 'optim-card'},
        el('div', {class: 'card-head'}, el('h2', {}, 'Learning rate and gradient norm'),
          el('span', {class: 'muted'}, 'rank 0\'s per logged step; the norm is before clipping (jobs with grad_clip)')),
        el('div', {class: 'two-col'}, lrHost, gnHost)),
      inferHost,
      el('section', {class: 'card'}, el('h2', {}, 'Ranks'),
        el('div', {class: 'table-wrap'}, el('table', {class: 'ranks', id: 'ranks-table'},
          el('thead', {}, el('tr', {}, el('th', {class: 'num'}, 'Rank'), el('th', {}, 'Device'), el('th', {class: 'num'}, 'PID'),
            el('th', {}, 'State'), el('th', {class: 'num'}, 'Step'), el('th', {class: 'num'}, 'Last loss'),
            el('th', {class: 'num'}, 'Samples/s'), el('th', {class: 'num'}, 'Exit code'))),
          rankBody))),
      el('div', {class: 'two-col'},
        el('section', {class: 'card'}, el('h2', {}, 'Spec'), specPre),
        el('section', {class: 'card'}, el('div', {class: 'card-head'}, el('h2', {}, 'Log'), logTabs, el('span', {class: 'grow'}),
          el('button', {type: 'button', class: 'small', onclick: () => loadLog()}, 'Refresh')), logPre)));

    chart = new ddpd.LossChart(chartHost);
    const evalChart = new ddpd.EvalChart(evalHost);
    const lrChart = new ddpd.LineChart(lrHost, {name: 'lr', yLabel: 'lr', fmtY: (v) => String(Number(v.toPrecision(4)))});
    const gnChart = new ddpd.LineChart(gnHost, {name: 'grad_norm', yLabel: 'gradient norm'});
    const LR_COLOR = '#7048e8', GN_COLOR = '#e8590c';
    try {
      smoothBox.value = localStorage.getItem(SMOOTH_KEY) || '0';
    } catch (e) { /* ignore */ }
    const setSmoothing = () => {
      chart.setSmoothing(smoothBox.value);
      fill(smoothVal, Number(smoothBox.value).toFixed(2));
      try {
        localStorage.setItem(SMOOTH_KEY, smoothBox.value);
      } catch (e) { /* ignore */ }
    };
    smoothBox.addEventListener('input', setSmoothing);
    setSmoothing();

    /* The lr of the latest step seen (loss events and /metrics carry it). */
    function showLr(step, lr) {
      if (typeof lr !== 'number' || step < lrStep) return;
      lrStep = step;
      fill(lrNow, `lr ${Number(lr.toPrecision(4))} (step ${U.fmtInt(step)})`);
    }

    function setMetrics(m, attempt) {
      chart.setMetrics(m, attempt);
      if (m.eval) evalChart.set(m.eval);
      if (m.lr) lrChart.setSeries([{key: 'lr', label: 'lr', color: LR_COLOR, xs: m.lr.step, ys: m.lr.lr}]);
      if (m.grad_norm) {
        gnChart.setSeries([{key: 'grad_norm', label: 'gradient norm', color: GN_COLOR, xs: m.grad_norm.step,
          ys: m.grad_norm.grad_norm}]);
      }
      if (m.lr && m.lr.step.length) showLr(m.lr.step[m.lr.step.length - 1], m.lr.lr[m.lr.lr.length - 1]);
    }
    chart.onSeries = (s) => addToggle(s);
    addToggle(chart.series.get('mean'));
    /* Log scale unless the user chose linear (losses span decades). */
    try {
      logBox.checked = localStorage.getItem(LOG_KEY) !== 'off';
    } catch (e) {
      logBox.checked = true;
    }
    chart.setLog(logBox.checked);
    logBox.addEventListener('change', () => {
      chart.setLog(logBox.checked);
      try {
        localStorage.setItem(LOG_KEY, logBox.checked ? 'on' : 'off');
      } catch (e) { /* ignore */ }
    });

    function addToggle(s) {
      if (toggles.querySelector(`[data-series="${s.key}"]`)) return;
      const cb = el('input', {type: 'checkbox', checked: true, dataset: {series: s.key}});
      cb.addEventListener('change', () => chart.setVisible(s.key, cb.checked));
      const lab = el('label', {class: 'check series-toggle'}, cb,
        el('span', {class: 'swatch' + (s.key === 'mean' ? ' swatch-mean' : ''), style: s.color ? {background: s.color} : {}}), s.label);
      const all = Array.from(toggles.children);
      const after = all.find((x) => {
        const k = x.querySelector('input').dataset.series;
        return k !== 'mean' && s.key !== 'mean' && Number(k.slice(1)) > s.rank;
      });
      toggles.insertBefore(lab, after || null);
    }

    function setPill(s) {
      streamStatus = s;
      const text = {connecting: 'connecting…', live: 'live', reconnecting: 'reconnecting…', ended: 'complete',
        error: 'stream failed', closed: '', metrics: 'from /metrics'}[s];
      fill(pill, text === undefined ? s : text);
      pill.className = 'pill pill-' + s;
      pill.hidden = !text;
    }

    /* ---- the job's data ---- */

    function totalSteps() {
      const b = batches.size ? Math.max(...batches.values()) : null;
      return job ? job.total_steps || U.totalSteps(job.spec, b) : null;
    }

    /* The steps of a failed or cancelled job's checkpoints, read once when it has ended
     * (null until then): the Resume button shows when there is one. */
    let ckptSteps = null, ckptAsked = false;
    function resumable(j) {
      if (j.state !== 'failed' && j.state !== 'cancelled') return false;
      if (!ckptAsked) {
        ckptAsked = true;
        api.get(`/v1/jobs/${id}/checkpoints`).then(r => {
          ckptSteps = r.checkpoints.map(c => c.step);
          if (!gone && job) renderHead();
        }).catch(() => {});
      }
      return !!(ckptSteps && ckptSteps.length);
    }

    function renderHead() {
      const j = job, final = U.isFinal(j.state);
      /* The actions the caller's role (or the job's owner) allows (app.js, ddpd.may). */
      const mine = !ddpd.may || ddpd.may('act', j.owner), mayRun = !ddpd.may || ddpd.may('submit');
      /* How many checkpoints an ended job has, once read (the Resume button's condition). */
      if (ckptSteps) head.dataset.checkpoints = String(ckptSteps.length);
      fill(head,
        el('h1', {}, `#${j.id} `, el('span', {class: 'job-name'}, j.name || '(unnamed)')),
        el('span', {id: 'job-state', dataset: {state: j.state}}, U.stateBadge(j.state)),
        el('span', {class: 'grow'}),
        el('div', {class: 'buttons'},
          mayRun ? el('button', {type: 'button', id: 'resubmit-btn', onclick: resubmit, title: 'Submit a copy of this spec now'}, 'Resubmit') : null,
          mayRun ? el('a', {class: 'button', href: '#/submit?from=' + j.id, title: 'Open this spec in the editor'}, 'Edit & resubmit') : null,
          /* A queued job has written nothing yet. */
          j.state === 'queued' ? null
            : el('button', {type: 'button', id: 'checkpoint-btn', onclick: download, title: 'The latest model.safetensors'}, 'Checkpoint'),
          /* A failed or cancelled job with a checkpoint continues as a new job. */
          resumable(j) && mine ? el('button', {type: 'button', id: 'resume-btn', onclick: resume,
            title: `Continue from its checkpoint at step ${ckptSteps[ckptSteps.length - 1]} as a new job`}, 'Resume') : null,
          /* A running job checkpoints and waits as preempted (POST .../preempt). */
          mine && j.state === 'running' ? el('button', {type: 'button', id: 'preempt-btn', onclick: preempt,
            title: 'Stop it at its next optimizer step with a checkpoint; it waits as preempted and resumes from there'},
          'Preempt') : null,
          !mine ? null
            : final ? el('button', {type: 'button', class: 'danger-ghost', id: 'delete-btn', onclick: remove}, 'Delete')
            : el('button', {type: 'button', class: 'danger', id: 'cancel-btn', onclick: cancel}, 'Cancel job')));
      fill(notices,
        j.error && j.error !== j.state ? el('div', {class: 'notice ' + (j.state === 'failed' ? 'notice-error' : 'notice-wait'), id: 'job-error'},
          el('b', {}, j.state === 'failed' ? 'Error: ' : 'Note: '), j.error) : null,
        j.pending_reason && !final ? el('div', {class: 'notice notice-wait'}, el('b', {}, 'Queued: '), j.pending_reason) : null);
      const total = totalSteps();
      const ev = U.evalText(j.metrics);
      const item = (k, v) => el('div', {class: 'summary-item'}, el('dt', {}, k), el('dd', {}, v));
      fill(summary,
        item('Progress', U.progress(j.step, total, j.state)),
        item('Loss (mean)', el('span', {class: 'mono', id: 'job-loss'}, U.lossCell(j.loss, j.loss_nonfinite))),
        /* The final and best eval (the server's metrics), for a job with eval. */
        (j.spec && j.spec.eval) || ev.final ? item('Eval (final)', el('span', {class: 'mono', id: 'job-eval-final'}, ev.final || '—')) : null,
        (j.spec && j.spec.eval) || ev.best ? item('Eval (best)', el('span', {class: 'mono', id: 'job-eval-best'}, ev.best || '—')) : null,
        item('Owner', el('span', {id: 'job-owner'}, j.owner || el('span', {class: 'muted', title: 'a job from before users: an admin\'s'}, '—'))),
        item('Priority', el('span', {id: 'job-priority'}, priorityText(j.spec))),
        item('Ranks', `${j.world_size} × ${j.device}`),
        item('Attempt', j.restarts ? `${j.attempt} (${j.restarts} restart${j.restarts === 1 ? '' : 's'})` : String(j.attempt || '—')),
        item('Started', el('span', {title: 'submitted ' + U.fmtTime(j.created_at)},
          j.started_at ? U.fmtTime(j.started_at) : 'submitted ' + U.fmtAge(j.created_at))),
        item('Finished', j.finished_at ? U.fmtTime(j.finished_at) : '—'),
        item(j.finished_at || !j.started_at ? 'Duration' : 'Running for', U.fmtDuration(U.jobDuration(j))),
        item('Preemptions', el('span', {id: 'job-preemptions'}, String(j.preemptions || 0))),
        restartsItem(j.restart_history),
        preemptionsItem(j.restart_history));
    }

    /* "50", "90 · not preemptible" (the spec's priority and preemptible). */
    function priorityText(spec) {
      if (!spec || typeof spec.priority !== 'number') return '—';
      return String(spec.priority) + (spec.preemptible === false ? ' · not preemptible' : '');
    }

    /* The job's preemptions (restart_history entries whose reason is "preempted"), oldest
     * first: when, by which job (absent: a user's request or Slurm's signal, which the
     * message names), the checkpoint's step it resumed from, and for a forced stop (no
     * checkpoint within its grace) the steps that lost. Nothing when it had none. */
    function preemptionsItem(hist) {
      const pre = Array.isArray(hist) ? hist.filter((h) => h.reason === 'preempted') : [];
      if (!pre.length) return null;
      const num = (v) => (typeof v === 'number' ? U.fmtInt(v) : '—');
      return el('div', {class: 'summary-item summary-restarts', id: 'job-preemption-list'},
        el('dt', {}, `Preempted (${pre.length})`),
        el('dd', {}, el('div', {class: 'table-wrap'}, el('table', {class: 'restarts', id: 'preemptions-table'},
          el('thead', {}, el('tr', {}, el('th', {class: 'num'}, 'Attempt'), el('th', {}, 'Time'), el('th', {}, 'By'),
            el('th', {class: 'num'}, 'Resumed from step'), el('th', {class: 'num'}, 'Lost steps'), el('th', {}, 'Message'))),
          el('tbody', {}, pre.map((h) => el('tr', {class: 'preemption-row', dataset: {attempt: h.attempt, by: h.by || ''}},
            el('td', {class: 'num'}, String(h.attempt)),
            el('td', {}, U.fmtTime(h.ts)),
            el('td', {class: 'preempt-by'}, h.by ? el('a', {href: '#/jobs/' + h.by}, 'job #' + h.by)
              : el('span', {class: 'muted', title: 'not another job: a user\'s preempt, or Slurm\'s signal (see the message)'}, 'a request')),
            el('td', {class: 'num preempt-step'}, num(h.step)),
            el('td', {class: 'num preempt-lost' + (h.forced ? ' preempt-forced' : ''),
              title: h.forced ? 'no checkpoint within its grace: it was stopped and resumed from its last checkpoint' : ''},
            h.forced ? num(h.lost_steps) : '0'),
            el('td', {class: 'preempt-msg'}, h.message || '—'))))))));
    }

    /* The job's restarts (preemptions are listed apart), oldest first, under its attempt;
     * nothing when it had none. */
    function restartsItem(all) {
      const hist = Array.isArray(all) ? all.filter((h) => h.reason !== 'preempted') : [];
      if (!hist.length) return null;
      return el('div', {class: 'summary-item summary-restarts', id: 'job-restarts'},
        el('dt', {}, `Restarts (${hist.length})`),
        el('dd', {}, el('div', {class: 'table-wrap'}, el('table', {class: 'restarts', id: 'restarts-table'},
          el('thead', {}, el('tr', {}, el('th', {class: 'num'}, 'Attempt'), el('th', {}, 'Time'),
            el('th', {class: 'num'}, 'Failed rank'), el('th', {class: 'num'}, 'Exit code'), el('th', {}, 'Message'))),
          el('tbody', {}, hist.map((h) => {
            /* rank and exit_code: null (absent from older servers) when no rank's failure ended the attempt */
            const num = (v) => (v === null || v === undefined ? '—' : String(v));
            return el('tr', {dataset: {attempt: h.attempt}},
              el('td', {class: 'num', title: `attempt ${h.attempt} ended; attempt ${h.attempt + 1} started`}, `${h.attempt} → ${h.attempt + 1}`),
              el('td', {}, U.fmtTime(h.ts)),
              el('td', {class: 'num'}, num(h.rank)),
              el('td', {class: 'num mono'}, num(h.exit_code)),
              el('td', {class: 'restart-msg', title: h.reason || ''}, h.reason || '—'));
          }))))));
    }

    /* Rank r on the r-th device the job holds (the scheduler hands slots in order). */
    function deviceOf(r) {
      if (slots && slots[r] !== undefined) return job.device === 'cuda' ? `cuda:${slots[r]}` : `cpu slot ${slots[r]}`;
      return job.device;
    }

    function renderRanks() {
      const ranks = job.ranks && job.ranks.length ? job.ranks
        : Array.from({length: job.world_size}, (_, r) => ({rank: r, state: job.state === 'queued' ? 'queued' : '—'}));
      fill(rankBody, ranks.map((r) => el('tr', {dataset: {rank: r.rank}},
        el('td', {class: 'num'}, el('span', {class: 'swatch', style: {background: ddpd.chartPalette[r.rank % ddpd.chartPalette.length]}}), String(r.rank)),
        el('td', {}, deviceOf(r.rank)),
        el('td', {class: 'num mono'}, r.pid ? String(r.pid) : '—'),
        el('td', {}, r.state ? U.stateBadge(r.state) : '—'),
        el('td', {class: 'num'}, U.fmtInt(r.step)),
        el('td', {class: 'num mono'}, U.lossCell(r.loss, r.loss_nonfinite)),
        el('td', {class: 'num'}, U.fmtRate(r.samples_per_s)),
        el('td', {class: 'num'}, r.exit_code === null || r.exit_code === undefined ? '—' : String(r.exit_code)))));
      if (logTabs.childElementCount !== job.world_size) {
        fill(logTabs, Array.from({length: Math.min(job.world_size, 64)}, (_, r) =>
          el('button', {type: 'button', class: 'tab' + (r === logRank ? ' tab-on' : ''), dataset: {rank: r},
            onclick: () => {
              logRank = r;
              Array.from(logTabs.children).forEach((b, k) => b.classList.toggle('tab-on', k === r));
              loadLog();
            }}, 'rank ' + r)));
      }
    }

    function render() {
      renderHead();
      renderRanks();
      /* The eval chart is for jobs with eval (or that sent eval events anyway). */
      evalCard.hidden = !(job.spec && job.spec.eval) && !evalChart.steps.length;
      /* The gradient norm is measured only where it clips (grad_clip). */
      gnHost.hidden = !(job.spec && job.spec.grad_clip > 0) && !gnChart.points();
      const text = JSON.stringify(job.spec, null, 2);
      if (specPre.textContent !== text) specPre.textContent = text;
      document.title = `#${job.id} ${job.name || ''} — ddpd`;
    }

    async function refresh() {
      const j = await api.get('/v1/jobs/' + id);
      const wasFinal = job && U.isFinal(job.state);
      job = j;
      if (!U.isFinal(j.state)) {
        try {
          const d = await api.get('/v1/devices');
          const mine = (j.device === 'cuda' ? d.gpus : d.cpu_slots) || [];
          const held = mine.filter((x) => x.job === j.id).map((x) => x.index);
          slots = held.length ? held : slots;
        } catch (e) { /* the device column falls back to the kind */ }
      }
      render();
      if (U.isFinal(j.state) && !wasFinal && stopPoll) {
        stopPoll();
        stopPoll = null;
        loadLog();
        if (stopLogs) stopLogs();
        stopLogs = null;
      }
      return j;
    }

    async function loadLog() {
      if (!job) return;
      try {
        const t = await api.get(`/v1/jobs/${id}/logs?rank=${logRank}&tail=200`);
        const text = t || '(nothing logged yet)';
        if (logPre.textContent !== text) {
          const atEnd = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 4;
          logPre.textContent = text;
          if (atEnd) logPre.scrollTop = logPre.scrollHeight;
        }
      } catch (e) {
        logPre.textContent = e.message;
      }
    }

    /* ---- the chart's feed ---- */

    function onEvent(ev, withLoss) {
      switch (ev.event) {
        case 'start':
          if (ev.batches) batches.set(ev.rank, ev.batches);
          break;
        case 'loss':
          /* A restart begins where the first loss of a later attempt is. */
          if (attemptSeen && ev.attempt > attemptSeen) chart.addMarker(ev.step, `restart (attempt ${ev.attempt})`, 'restart');
          attemptSeen = Math.max(attemptSeen, ev.attempt || 0);
          /* A NaN or infinite loss leaves a gap in the lines: mark where it happened. */
          if (ev.nonfinite) chart.addMarker(ev.step, `non-finite loss (rank ${ev.rank})`, 'nonfinite');
          if (withLoss) chart.addLoss(ev.rank, ev.step, ev.loss, ev.attempt);
          showLr(ev.step, ev.lr);
          if (withLoss && ev.rank === 0) {
            if (typeof ev.lr === 'number') lrChart.addPoint('lr', 'lr', LR_COLOR, ev.step, ev.lr);
            if (typeof ev.grad_norm === 'number') gnChart.addPoint('grad_norm', 'gradient norm', GN_COLOR, ev.step, ev.grad_norm);
          }
          break;
        case 'eval':
          evalChart.add(ev);
          evalCard.hidden = false;
          break;
        case 'join':
          chart.addMarker(ev.step, `rank ${ev.rank} joined`, 'join');
          break;
        case 'state':
          if (!job || !U.isFinal(job.state)) refresh().catch(() => {});
          break;
        default:
          break;
      }
    }

    function follow(after, withLoss) {
      stream = api.stream(id, after, {
        onEvent: (ev) => onEvent(ev, withLoss),
        onStatus: (s) => setPill(withLoss || s === 'error' ? s : 'metrics'),
      });
    }

    async function startChart(j) {
      const W = j.world_size || 1, every = (j.spec && j.spec.log_every) || 1;
      const est = (W * (j.step || 0)) / every;
      const maxPoints = Math.max(200, Math.min(4000, Math.round(chartHost.clientWidth * 2) || 2000));
      if (U.isFinal(j.state)) {
        const m = await api.get(`/v1/jobs/${id}/metrics?max_points=${maxPoints}`);
        setMetrics(m, j.attempt);
        setPill('metrics');
        /* For the markers and batches only; the lines are /metrics'. */
        if (est <= MARKERS_FROM_EVENTS) follow(0, false);
        return;
      }
      if (est <= LINES_FROM_EVENTS) return follow(0, true);
      const minStep = Math.min(...(j.ranks || []).map((r) => r.step || 0), j.step || 0);
      const m = await api.get(`/v1/jobs/${id}/metrics?max_points=${maxPoints}`);
      setMetrics(m, j.attempt);
      /* Loss events at steps /metrics has are repeats, which the chart drops. */
      if (est <= MARKERS_FROM_EVENTS) return follow(0, true);
      /* Only from a sequence number /metrics is sure to cover: each rank had sent at
       * least minStep / log_every loss events before the job was read. */
      attemptSeen = j.attempt || 0;
      follow(Math.max(0, W * Math.floor(minStep / every) - 2000), true);
    }

    /* ---- buttons ---- */

    async function cancel() {
      const ok = await U.confirmDialog(`Cancel job #${id}?`,
        `Its ranks get SIGTERM and the job ends as cancelled. Checkpoints written so far are kept.`, 'Cancel job');
      if (!ok) return;
      try {
        await api.post(`/v1/jobs/${id}/cancel`);
        U.toast(`Cancelling job #${id}…`);
      } catch (e) {
        U.toast(e.message, 'error');
      }
      refresh().catch(() => {});
    }

    async function preempt() {
      const ok = await U.confirmDialog(`Preempt job #${id}?`,
        'Its ranks checkpoint at their next optimizer step and stop; it waits in the queue as preempted and resumes from that checkpoint when there is room.',
        'Preempt');
      if (!ok) return;
      try {
        await api.post(`/v1/jobs/${id}/preempt`);
        U.toast(`Preempting job #${id}: it stops at its next checkpoint…`);
      } catch (e) {
        U.toast(e.message, 'error');
      }
      refresh().catch(() => {});
    }

    async function remove() {
      const ok = await U.confirmDialog(`Delete job #${id}?`, 'Its row, its events, its logs and its checkpoints are removed for good.', 'Delete');
      if (!ok) return;
      try {
        await api.del('/v1/jobs/' + id);
        U.toast(`Job #${id} deleted`);
        location.hash = '#/jobs';
      } catch (e) {
        U.toast(e.message, 'error');
      }
    }

    async function resume() {
      try {
        const next = await api.post(`/v1/jobs/${id}/resume`);
        U.toast(`Job #${id} continues as job #${next.id} from step ${next.resumed_from_step}`, 'ok');
        location.hash = '#/jobs/' + next.id;
      } catch (e) {
        U.toast(`Resume failed: ${e.message}`, 'error');
      }
    }

    async function resubmit() {
      try {
        const copy = await api.post('/v1/jobs', job.spec);
        U.toast(`Submitted a copy as job #${copy.id}`, 'ok');
        location.hash = '#/jobs/' + copy.id;
      } catch (e) {
        U.toast(`Resubmit failed: ${e.path ? e.path + ': ' : ''}${e.message}`, 'error');
      }
    }

    async function download() {
      const path = `/v1/jobs/${id}/checkpoint`;
      const name = `job-${id}-model.safetensors`;
      try {
        if (!api.token()) {
          await api.request('HEAD', path); /* a 404 becomes a message, not a downloaded error */
          el('a', {href: api.url(path), download: name}).click();
          return;
        }
        const res = await api.request('GET', path, {raw: true});
        const href = URL.createObjectURL(await res.blob());
        el('a', {href, download: name}).click();
        setTimeout(() => URL.revokeObjectURL(href), 10000);
      } catch (e) {
        U.toast(e.status === 404 ? `Job #${id} has no checkpoint yet` : e.message, 'error');
      }
    }

    /* ---- start ---- */

    (async () => {
      try {
        const j = await refresh();
        if (gone) return;
        /* Once: the spec does not change, and the box keeps what it generated. */
        infer = ddpd.inference.card(id, j.spec);
        if (infer) fill(inferHost, infer.el);
        await startChart(j);
        if (gone) return;
        if (!U.isFinal(j.state)) {
          stopPoll = U.every(2000, refresh);
          stopLogs = U.every(3000, loadLog);
        } else {
          loadLog();
        }
      } catch (e) {
        if (!job) fill(head, el('h1', {}, `Job #${id}`));
        fill(notices, el('div', {class: 'notice notice-error', role: 'alert'}, e.message));
      }
    })();

    return () => {
      gone = true;
      if (infer) infer.destroy();
      if (stream) stream.close();
      if (stopPoll) stopPoll();
      if (stopLogs) stopLogs();
      chart.destroy();
      evalChart.destroy();
      lrChart.destroy();
      gnChart.destroy();
    };
  }

  ddpd.views = Object.assign(ddpd.views || {}, {job: jobView});
})();
