/* sweep.js — the Sweeps pages: the list (#/sweeps) and one sweep (#/sweeps/3): its trials
 * ranked by the metric as the server ranks them (GET /v1/sweeps/{id}), their states, the
 * best trial's spec, and the compare view of the top trials' jobs (compare.js's mount, drawn
 * again when the top changes; a link opens it as its own page, #/compare?ids=...).
 * Both refresh every 2 s while shown (U.every). */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});
  const U = ddpd.util, api = ddpd.api;
  const {el, fill} = U;
  /* The top trials the compare view gets. */
  const COMPARE_TOP = 5;

  const errorBox = U.errorBox;

  /* A sweep's state and a trial's `pending` look like a job's states. */
  const sweepState = (s) => U.stateBadge(s);
  const fmtMetric = (v) => (v === null || v === undefined ? '—' : Number(v).toPrecision(6));
  const fmtParams = (p) => Object.entries(p || {}).map(([k, v]) => `${k} = ${JSON.stringify(v)}`).join(', ');

  function sweepsView(root) {
    const tbody = el('tbody');
    const msg = el('div');
    fill(root, el('div', {class: 'page-head'}, el('h1', {}, 'Sweeps')),
      el('p', {class: 'muted'}, 'Hyper-parameter sweeps: POST /v1/sweeps or ', el('code', {}, 'ddpd sweep submit FILE'),
        ' (docs/api.md, "Sweeps").'),
      msg,
      el('div', {class: 'table-wrap'}, el('table', {class: 'jobs', id: 'sweeps-table'},
        el('thead', {}, el('tr', {}, el('th', {class: 'num'}, 'ID'), el('th', {}, 'State'), el('th', {}, 'Method'),
          el('th', {}, 'Metric'), el('th', {class: 'num'}, 'Trials'), el('th', {}, 'Age'))), tbody)));
    return U.every(2000, async () => {
      let d;
      try {
        d = await api.get('/v1/sweeps?limit=100');
        fill(msg);
      } catch (e) {
        if (e.status) fill(msg, errorBox(e));
        throw e;
      }
      fill(tbody, d.sweeps.length ? d.sweeps.map((s) => el('tr', {class: 'sweep-row', dataset: {sweepId: s.id}},
        el('td', {class: 'num'}, el('a', {href: '#/sweeps/' + s.id}, '#' + s.id)),
        el('td', {}, sweepState(s.state)),
        el('td', {}, s.method),
        el('td', {}, `${s.metric} (${s.mode})`),
        el('td', {class: 'num'}, String(s.trials)),
        el('td', {title: U.fmtTime(s.created_at)}, U.fmtAge(s.created_at))))
        : el('tr', {}, el('td', {colspan: 6, class: 'muted'}, 'No sweeps yet.')));
    });
  }

  function sweepView(root, params, id) {
    const head = el('div', {class: 'page-head'}, el('h1', {}, `Sweep #${id}`));
    const msg = el('div');
    const body = el('div');
    /* Outside `body`, which each poll draws anew: the comparison is drawn only when the
     * top trials change (it fetches every one's curves). */
    const cmpView = el('div', {id: 'sweep-top-compare'});
    const cmpCard = el('section', {class: 'card', hidden: ''}, el('h2', {}, 'The top trials compared'), cmpView);
    fill(root, head, msg, body, cmpCard);
    let cancelBtn = null, cmpKey = '', cmpUnmount = null;
    const stop = U.every(2000, async () => {
      let s;
      try {
        s = await api.get('/v1/sweeps/' + id);
        fill(msg);
      } catch (e) {
        if (e.status) fill(msg, errorBox(e));
        throw e;
      }
      document.title = `ddpd · sweep #${id}`;
      const top = s.trials.filter((t) => t.job && t.metric !== null).slice(0, COMPARE_TOP).map((t) => t.job);
      if (top.join(',') !== cmpKey) {
        cmpKey = top.join(',');
        if (cmpUnmount) cmpUnmount();
        cmpUnmount = top.length > 1 ? ddpd.compare.mount(cmpView, top) : null;
        cmpCard.hidden = top.length < 2;
      }
      /* A viewer may not cancel, a user only their own sweep, an admin any. */
      cancelBtn = s.state === 'running' && (!ddpd.may || ddpd.may('cancel', s.owner)) ? el('button', {type: 'button', class: 'danger', id: 'sweep-cancel', onclick: async () => {
        try {
          await api.post(`/v1/sweeps/${id}/cancel`);
          U.toast(`Sweep #${id} is being cancelled`);
        } catch (e) {
          fill(msg, errorBox(e));
        }
      }}, 'Cancel sweep') : null;
      fill(head, el('h1', {}, `Sweep #${id} `, el('span', {id: 'sweep-state'}, sweepState(s.state))), el('span', {class: 'grow'}),
        top.length > 1 ? el('a', {class: 'button', id: 'sweep-compare', href: '#/compare?ids=' + top.join(',')},
          `Compare the top ${top.length}`) : null,
        cancelBtn);
      const counts = Object.entries(s.counts || {}).map(([k, n]) => `${n} ${k}`).join(' · ');
      /* asha: each trial's rung, and (hover) the jobs and metrics of the rungs it completed. */
      const asha = s.method === 'asha';
      const rungsTitle = (t) => (t.rungs || []).map((r) => `rung ${r.rung}: step ${r.step}, job #${r.job}, ${fmtMetric(r.metric)}`).join('\n');
      const rows = s.trials.map((t) => el('tr', {class: 'trial-row state-row-' + t.state, dataset: {trial: t.index, state: t.state}},
        el('td', {class: 'num'}, String(t.rank)),
        el('td', {class: 'num'}, String(t.index)),
        el('td', {class: 'num'}, t.job ? el('a', {href: '#/jobs/' + t.job}, '#' + t.job) : '—'),
        el('td', {}, U.stateBadge(t.state)),
        el('td', {class: 'num mono trial-metric'}, fmtMetric(t.metric)),
        ...(asha ? [el('td', {class: 'num trial-rung', title: rungsTitle(t)}, String(t.rung))] : []),
        el('td', {class: 'mono trial-params'}, fmtParams(t.params))));
      fill(body,
        el('p', {class: 'muted'}, `${s.method}, ${s.metric} (${s.mode}), at most ${s.max_parallel} at once — ${counts}`),
        el('section', {class: 'card'}, el('h2', {}, 'Trials, best first'),
          el('div', {class: 'table-wrap'}, el('table', {class: 'jobs', id: 'trials-table'},
            el('thead', {}, el('tr', {}, el('th', {class: 'num'}, 'Rank'), el('th', {class: 'num'}, 'Trial'),
              el('th', {class: 'num'}, 'Job'), el('th', {}, 'State'), el('th', {class: 'num'}, s.metric),
              ...(asha ? [el('th', {class: 'num', title: 'the rung its latest job runs to'}, 'Rung')] : []), el('th', {}, 'Values'))),
            el('tbody', {}, rows)))),
        el('section', {class: 'card', id: 'sweep-best'}, el('h2', {}, 'Best trial'),
          s.best ? [el('p', {}, `Trial ${s.best.index} (`, el('a', {href: '#/jobs/' + s.best.job}, '#' + s.best.job),
            `): ${s.metric} = ${fmtMetric(s.best.metric)} with ${fmtParams(s.best.params)}`),
          el('pre', {class: 'spec mono'}, JSON.stringify(s.best.spec, null, 2))]
            : el('p', {class: 'muted'}, 'None yet: no trial has succeeded with a metric.')));
    });
    return () => {
      stop();
      if (cmpUnmount) cmpUnmount();
    };
  }

  ddpd.views = Object.assign(ddpd.views || {}, {sweeps: sweepsView, sweep: sweepView});
})();
