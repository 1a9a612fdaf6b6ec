/* queue.js — the Queue page (#/queue): GET /v1/queue as two tables, the running jobs in
 * start order (owner, priority, devices, state and whether it is being preempted, how long
 * they have run, their time limit) and the pending ones in the order they would start,
 * each with why it waits, in full. Every row links to its job. Refreshed every 2 s while
 * shown (U.every); stops when left. */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});
  const U = ddpd.util, api = ddpd.api;
  const {el, fill} = U;

  const errorBox = U.errorBox;

  const kindWord = (d) => (d === 'cuda' ? 'GPU' : 'CPU');
  /* A running job's devices: "GPU 0, 1" (its slots), or "2 × CPU" when the launcher places
   * the ranks (Slurm: no slots). */
  const runningDevices = (j) => (j.slots && j.slots.length ? `${kindWord(j.device)} ${j.slots.join(', ')}`
    : `${j.world_size} × ${kindWord(j.device)}`);
  /* The priority, and the effective one when aging raised it: "30 (+5)". */
  const pendingPriority = (j) => (j.effective_priority > j.priority
    ? el('span', {title: `effective priority ${j.effective_priority}`}, `${j.priority} (+${j.effective_priority - j.priority})`)
    : String(j.priority));
  /* A running job's priority, marked when it may not be preempted. */
  const runningPriority = (j) => (j.preemptible === false
    ? el('span', {}, String(j.priority), el('span', {class: 'muted'}, ' not preemptible')) : String(j.priority));
  /* null: a job from before users (an admin's). */
  const owner = (o) => (o ? o : el('span', {class: 'muted', title: 'no owner: a job from before users'}, '—'));
  const jobLink = (j) => el('a', {href: '#/jobs/' + j.id}, '#' + j.id);

  function queueView(root) {
    const msg = el('div');
    const summary = el('p', {class: 'muted', id: 'queue-summary'});
    const runBody = el('tbody');
    const waitBody = el('tbody');
    const waitHead = el('h2', {}, 'Pending');
    fill(root, el('div', {class: 'page-head'}, el('h1', {}, 'Queue')), msg, summary,
      el('section', {class: 'card'}, el('h2', {}, 'Running'),
        el('div', {class: 'table-wrap'}, el('table', {class: 'jobs', id: 'queue-running'},
          el('thead', {}, el('tr', {}, el('th', {class: 'num'}, 'ID'), el('th', {}, 'Name'), el('th', {}, 'Owner'),
            el('th', {class: 'num'}, 'Priority'), el('th', {}, 'Devices'), el('th', {}, 'State'),
            el('th', {}, 'Running for'), el('th', {}, 'Time limit'))), runBody))),
      el('section', {class: 'card'}, waitHead,
        el('div', {class: 'table-wrap'}, el('table', {class: 'jobs', id: 'queue-pending'},
          el('thead', {}, el('tr', {}, el('th', {class: 'num', title: 'its place in its device kind\'s queue'}, '#'),
            el('th', {class: 'num'}, 'ID'), el('th', {}, 'Name'), el('th', {}, 'Owner'),
            el('th', {class: 'num'}, 'Priority'), el('th', {}, 'Devices'), el('th', {}, 'State'),
            el('th', {}, 'Waited'), el('th', {}, 'Why it waits'))), waitBody))));

    return U.every(2000, async () => {
      let q;
      try {
        q = await api.get('/v1/queue');
        fill(msg);
      } catch (e) {
        if (e.status) fill(msg, errorBox(e));
        throw e;
      }
      const slots = q.slots || {};
      fill(summary, `${q.running.length} running, ${q.pending_total} pending — `
        + `${slots.gpus || 0} GPU${slots.gpus === 1 ? '' : 's'}, ${slots.cpu || 0} CPU slot${slots.cpu === 1 ? '' : 's'}.`);
      fill(runBody, q.running.length ? q.running.map((j) => el('tr', {class: 'queue-row', dataset: {jobId: j.id}},
        el('td', {class: 'num'}, jobLink(j)),
        el('td', {}, el('a', {href: '#/jobs/' + j.id}, j.name || '—')),
        el('td', {}, owner(j.owner)),
        el('td', {class: 'num'}, runningPriority(j)),
        el('td', {}, runningDevices(j)),
        /* Asked to checkpoint and make room: it stops at its next optimizer step. */
        el('td', {}, U.stateBadge(j.state), j.preempting ? el('span', {class: 'preempting', dataset: {preempting: 'true'},
          title: 'preempting: asked to checkpoint at its next optimizer step, then it waits as preempted'},
        ' preempting: stopping at a checkpoint') : null),
        el('td', {}, U.fmtDuration(j.running_s)),
        el('td', {}, j.time_limit ? U.fmtDuration(j.time_limit) : '—')))
        : el('tr', {}, el('td', {colspan: 8, class: 'muted'}, 'No job is running.')));
      fill(waitHead, 'Pending', q.pending.length < q.pending_total
        ? el('span', {class: 'muted'}, ` — the first ${q.pending.length} of ${q.pending_total}`) : null);
      fill(waitBody, q.pending.length ? q.pending.map((j) => el('tr', {class: 'queue-row', dataset: {jobId: j.id}},
        el('td', {class: 'num'}, String(j.position)),
        el('td', {class: 'num'}, jobLink(j)),
        el('td', {}, el('a', {href: '#/jobs/' + j.id}, j.name || '—')),
        el('td', {}, owner(j.owner)),
        el('td', {class: 'num'}, pendingPriority(j)),
        el('td', {}, `${j.world_size} × ${kindWord(j.device)}`),
        el('td', {}, U.stateBadge(j.state)),
        el('td', {}, U.fmtDuration(j.waited_s)),
        el('td', {class: 'queue-reason'}, j.reason || el('span', {class: 'muted'}, '—'))))
        : el('tr', {}, el('td', {colspan: 9, class: 'muted'}, 'No job is waiting.')));
    });
  }

  ddpd.views = Object.assign(ddpd.views || {}, {queue: queueView});
})();
