/* views.js — the Jobs list, the Submit page and the Devices page. A view is
 * mount(root, params) -> unmount(); the job page is in job.js, the router in app.js. */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});
  const U = ddpd.util, api = ddpd.api;
  const {el, fill} = U;

  const errorBox = U.errorBox;

  /* ---- Jobs ------------------------------------------------------------------------------ */

  const FILTERS = [
    {label: 'All', state: ''},
    {label: 'Active', state: 'queued,starting,running,preempted'},
    ...U.STATES.map((s) => ({label: s, state: s})),
  ];
  /* "Newer" goes back through the cursors that "Older" followed (per filter). */
  const cursorTrail = new Map();

  function jobsHash(state, before, limit, tag) {
    const q = new URLSearchParams();
    if (state) q.set('state', state);
    if (tag) q.set('tag', tag);
    if (before) q.set('before', before);
    if (limit && limit !== 25) q.set('limit', String(limit));
    const s = q.toString();
    return '#/jobs' + (s ? '?' + s : '');
  }

  function jobsView(root, params) {
    const state = params.get('state') || '';
    const before = params.get('before') || '';
    const limit = Math.min(200, Math.max(1, Number(params.get('limit')) || 25));
    const tag = params.get('tag') || '';
    const trailKey = state + '|' + limit + '|' + tag;
    const trail = cursorTrail.get(trailKey) || [];
    cursorTrail.set(trailKey, trail);
    if (!before) trail.length = 0;

    const tbody = el('tbody');
    const msg = el('div', {class: 'list-msg'});
    /* The jobs ticked for Compare (kept across the list's refreshes). */
    const selected = new Set();
    const compareBtn = el('button', {type: 'button', id: 'compare-btn', disabled: true,
      title: 'Tick two or more jobs to see their curves, metrics and spec differences side by side',
      onclick: () => {
        location.hash = '#/compare?ids=' + Array.from(selected).join(',');
      }}, 'Compare');
    const showSelected = () => {
      compareBtn.disabled = selected.size < 2;
      fill(compareBtn, selected.size ? `Compare (${selected.size})` : 'Compare');
    };
    const pager = el('div', {class: 'pager'});
    const chips = el('div', {class: 'chips', role: 'group', 'aria-label': 'filter by state'},
      FILTERS.map((f) => el('a', {class: 'chip' + (f.state === state ? ' chip-on' : '') + (U.STATES.includes(f.state) ? ' chip-' + f.state : ''),
        href: jobsHash(f.state, '', limit, tag), dataset: {filter: f.state || 'all'}}, f.label)),
      /* The tag filter (a job's tags link here): shown with a way out. */
      tag ? el('span', {class: 'chip chip-on chip-tag', id: 'tag-filter'}, 'tag: ' + tag + ' ',
        el('a', {href: jobsHash(state, '', limit, ''), title: 'every tag', 'aria-label': 'clear the tag filter'}, '×')) : null);
    fill(root,
      el('div', {class: 'page-head'}, el('h1', {}, 'Jobs'), el('span', {class: 'grow'}), compareBtn,
        /* A viewer may only read (app.js, ddpd.may). */
        !ddpd.may || ddpd.may('submit') ? el('a', {class: 'button primary', id: 'submit-link', href: '#/submit'}, 'Submit a job') : null),
      chips,
      el('div', {class: 'table-wrap'},
        el('table', {class: 'jobs', id: 'jobs-table'},
          el('thead', {}, el('tr', {},
            el('th', {class: 'col-select', title: 'select for Compare'}, ''),
            el('th', {class: 'num'}, 'ID'), el('th', {}, 'Name'), el('th', {}, 'State'), el('th', {}, 'Ranks'),
            el('th', {class: 'col-progress'}, 'Progress'), el('th', {class: 'num'}, 'Loss'),
            el('th', {class: 'num', title: 'the best eval (accuracy for classifiers, else loss) and the final one'}, 'Eval'),
            el('th', {}, 'Age'),
            el('th', {}, 'Duration'))),
          tbody)),
      msg, pager);

    let next = null;
    const render = (data) => {
      next = data.next;
      const rows = data.jobs.map((j) => {
        /* The server's count (file data too: its planner read the files), else the spec's. */
        const total = j.total_steps || U.totalSteps(j.spec);
        const pick = el('input', {type: 'checkbox', class: 'job-select', checked: selected.has(j.id),
          dataset: {jobId: j.id}, 'aria-label': 'select job ' + j.id + ' for Compare'});
        pick.addEventListener('change', () => {
          if (pick.checked) selected.add(j.id);
          else selected.delete(j.id);
          showSelected();
        });
        const tr = el('tr', {class: 'job-row state-row-' + j.state, dataset: {jobId: j.id, state: j.state}},
          el('td', {class: 'col-select'}, pick),
          el('td', {class: 'num'}, el('a', {href: '#/jobs/' + j.id}, '#' + j.id)),
          el('td', {class: 'name'}, el('a', {href: '#/jobs/' + j.id}, j.name || '(unnamed)'),
            (j.tags || []).length ? el('div', {class: 'tags'}, j.tags.map((t) =>
              el('a', {class: 'tag', href: jobsHash(state, '', limit, t), dataset: {tag: t}}, t))) : null,
            j.pending_reason && j.state === 'queued' ? el('div', {class: 'sub'}, j.pending_reason) : null,
            j.error && j.error !== j.state ? el('div', {class: 'sub sub-error', title: j.error}, j.error) : null),
          el('td', {}, U.stateBadge(j.state)),
          el('td', {}, `${j.world_size} × ${j.device}`),
          el('td', {class: 'col-progress'}, U.progress(j.step, total, j.state)),
          el('td', {class: 'num mono'}, U.lossCell(j.loss, j.loss_nonfinite)),
          U.evalCell(j.metrics),
          el('td', {title: U.fmtTime(j.created_at)}, U.fmtAge(j.created_at)),
          el('td', {}, U.fmtDuration(U.jobDuration(j))));
        tr.addEventListener('click', (e) => {
          if (e.target.closest('a') || e.target.closest('.col-select')) return;
          location.hash = '#/jobs/' + j.id;
        });
        return tr;
      });
      fill(tbody, rows);
      fill(msg, data.jobs.length ? null : el('p', {class: 'empty'},
        tag ? `No jobs tagged ${tag}${state ? ' in this state' : ''}. ` : state ? 'No jobs in this state. ' : 'No jobs yet. ', el('a', {href: '#/submit'}, 'Submit one.')));
      fill(pager,
        before ? el('a', {class: 'button', href: jobsHash(state, trail.length > 1 ? trail[trail.length - 2] : '', limit, tag),
          dataset: {page: 'newer'}, onclick: () => trail.pop()}, '← Newer') : null,
        el('span', {class: 'grow'}),
        next ? el('a', {class: 'button', href: jobsHash(state, next, limit, tag), dataset: {page: 'older'},
          onclick: () => trail.push(next)}, 'Older →') : null);
    };

    const q = new URLSearchParams({limit: String(limit)});
    if (state) q.set('state', state);
    if (tag) q.set('tag', tag);
    if (before) q.set('before', before);
    let shownError = false;
    const stop = U.every(2000, async () => {
      try {
        render(await api.get('/v1/jobs?' + q));
        shownError = false;
      } catch (e) {
        if (e.status && !shownError) fill(msg, errorBox(e));
        shownError = true;
        throw e;
      }
    });
    return stop;
  }

  /* ---- Submit ------------------------------------------------------------------------------ */

  /* "model[2].in", "optimizer.lr", 'data.target[1]', '["odd key"]' -> ['model', 2, 'in'] */
  function parsePath(path) {
    const out = [];
    const re = /\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]|\.?([^.[\]]+)/g;
    let m;
    while ((m = re.exec(path || ''))) {
      if (m[1] !== undefined) out.push(Number(m[1]));
      else if (m[2] !== undefined) {
        try {
          out.push(JSON.parse(m[2]));
        } catch (e) {
          out.push(m[2]);
        }
      } else out.push(m[3]);
    }
    return out;
  }

  /* JSON text -> a tree of values with their offsets (lenient: the server judges). */
  function parseWithPos(text) {
    let i = 0;
    const ws = () => {
      while (i < text.length && ' \t\r\n'.includes(text[i])) i++;
    };
    const str = () => {
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      const v = JSON.parse(text.slice(i, j + 1));
      i = j + 1;
      return v;
    };
    const value = () => {
      ws();
      const start = i;
      const c = text[i];
      if (c === '{' || c === '[') {
        const obj = c === '{';
        const node = obj ? {type: 'object', start, members: new Map()} : {type: 'array', start, items: []};
        i++;
        ws();
        if (text[i] === (obj ? '}' : ']')) {
          i++;
          node.end = i;
          return node;
        }
        for (;;) {
          ws();
          if (obj) {
            const keyStart = i;
            const k = str();
            ws();
            i++; /* ':' */
            const v = value();
            if (!node.members.has(k)) node.members.set(k, {keyStart, value: v});
          } else node.items.push(value());
          ws();
          if (text[i] === ',') {
            i++;
            continue;
          }
          i++;
          node.end = i;
          return node;
        }
      }
      if (c === '"') {
        str();
        return {type: 'string', start, end: i};
      }
      while (i < text.length && !',]} \t\r\n'.includes(text[i])) i++;
      if (i === start) throw new Error('unexpected character at ' + i);
      return {type: 'scalar', start, end: i};
    };
    return value();
  }

  function lineOf(text, offset) {
    let line = 1;
    for (let k = 0; k < offset && k < text.length; k++) if (text[k] === '\n') line++;
    return line;
  }

  /* Where `path` is in `text`: {start, end, line, exact}; null when the text is not JSON.
   * A key that is not there (a missing required key) gives its nearest parent. */
  function locate(text, path) {
    let node;
    try {
      node = parseWithPos(text);
    } catch (e) {
      return null;
    }
    let start = node.start, exact = true;
    for (const t of parsePath(path)) {
      if (node.type === 'object' && typeof t === 'string' && node.members.has(t)) {
        const m = node.members.get(t);
        start = m.keyStart;
        node = m.value;
      } else if (node.type === 'array' && typeof t === 'number' && t < node.items.length) {
        node = node.items[t];
        start = node.start;
      } else {
        exact = false;
        break;
      }
    }
    return {start, end: node.end, line: lineOf(text, start), exact};
  }

  const DRAFT_KEY = 'ddpd.draft';
  const LINE_H = 20, EDIT_PAD = 10;

  function submitView(root, params) {
    if (ddpd.may && !ddpd.may('submit')) {
      const me = ddpd.me;
      fill(root, el('div', {class: 'page-head'}, el('h1', {}, 'Submit a job')),
        el('div', {class: 'notice notice-wait', id: 'submit-forbidden'},
          `${me.role} ${me.name} may only read: submitting a job needs the role user or admin.`));
      return null;
    }
    const ta = el('textarea', {id: 'spec-editor', class: 'editor-text', spellcheck: 'false', autocapitalize: 'off',
      autocomplete: 'off', wrap: 'off', 'aria-label': 'job spec (JSON)'});
    const gutter = el('div', {class: 'editor-gutter', 'aria-hidden': 'true'});
    const band = el('div', {class: 'editor-band', hidden: true});
    const callout = el('div', {class: 'editor-callout', id: 'spec-callout', hidden: true, role: 'alert'});
    const errors = el('div', {id: 'submit-error', class: 'submit-error', hidden: true});
    const status = el('span', {class: 'submit-status'});
    const submitBtn = el('button', {class: 'primary', id: 'submit-btn', type: 'button'}, 'Submit');
    const tplButtons = ddpd.templates.map((t) => el('button', {type: 'button', class: 'template', title: t.about,
      dataset: {template: t.id}, onclick: () => load(JSON.stringify(t.spec, null, 2) + '\n')}, t.title));
    let errLine = 0;

    fill(root,
      el('div', {class: 'page-head'}, el('h1', {}, 'Submit a job')),
      el('div', {class: 'templates'}, el('span', {class: 'label'}, 'Start from:'), tplButtons),
      el('p', {class: 'hint'}, 'The job spec (docs/spec.md in the ddpd source: every key with its default and limits, an example per model family): model, loss, optimizer, data, batch_size, epochs or steps, … ',
        'Unknown keys are errors; the server names the path of anything it does not accept.'),
      el('div', {class: 'editor'}, gutter, el('div', {class: 'editor-main'}, band, ta, callout)),
      errors,
      el('div', {class: 'actions'}, submitBtn,
        el('button', {type: 'button', onclick: format}, 'Format'), status));

    function lines() {
      const n = ta.value.split('\n').length;
      const have = gutter.childElementCount;
      if (have !== n) {
        const frag = [];
        for (let k = 1; k <= n; k++) frag.push(el('div', {class: k === errLine ? 'gl gl-err' : 'gl'}, String(k)));
        fill(gutter, frag);
      } else {
        Array.from(gutter.children).forEach((d, k) => d.classList.toggle('gl-err', k + 1 === errLine));
      }
      gutter.scrollTop = ta.scrollTop;
      place();
    }

    function place() {
      if (!errLine) return;
      const top = EDIT_PAD + (errLine - 1) * LINE_H - ta.scrollTop;
      band.style.top = top + 'px';
      callout.style.top = top + LINE_H + 2 + 'px';
      const visible = top > -LINE_H && top < ta.clientHeight;
      band.hidden = !visible;
      callout.hidden = !visible;
    }

    function clearError() {
      errLine = 0;
      band.hidden = callout.hidden = errors.hidden = true;
      fill(errors);
      lines();
    }

    function load(text) {
      ta.value = text;
      clearError();
      fill(status);
      save();
    }

    function save() {
      try {
        sessionStorage.setItem(DRAFT_KEY, ta.value);
      } catch (e) { /* ignore */ }
    }

    function format() {
      try {
        load(JSON.stringify(JSON.parse(ta.value), null, 2) + '\n');
      } catch (e) {
        showError({message: 'not JSON: ' + e.message, path: ''});
      }
    }

    /* An error from the server: at its JSON path (422) or line/column (400). */
    function showError(e) {
      let line = 0, where = null;
      const lc = /line (\d+), column (\d+)/.exec(e.message || '');
      if (e.path) where = locate(ta.value, e.path);
      if (where) line = where.line;
      else if (lc) line = Number(lc[1]);
      errLine = line;
      const label = e.path ? e.path : line ? 'line ' + line : 'spec';
      fill(callout, el('code', {class: 'err-path'}, label), ' ', e.message);
      callout.title = e.message;
      fill(errors,
        el('div', {class: 'notice notice-error', role: 'alert'},
          el('b', {}, e.status === 422 ? 'Invalid spec' : e.status === 400 ? 'Not valid JSON' : 'Not submitted'),
          ': ', e.path ? el('code', {class: 'err-path'}, e.path) : null, e.path ? ' — ' : '', e.message,
          line ? ' ' : null, line ? el('button', {type: 'button', class: 'link', onclick: () => reveal(where, line)}, `(line ${line})`) : null));
      errors.hidden = false;
      lines();
      if (line) reveal(where, line);
    }

    function reveal(where, line) {
      const top = (line - 1) * LINE_H;
      if (top < ta.scrollTop || top > ta.scrollTop + ta.clientHeight - 3 * LINE_H) ta.scrollTop = Math.max(0, top - 3 * LINE_H);
      if (where && where.exact) {
        ta.focus({preventScroll: true});
        ta.setSelectionRange(where.start, where.end);
      }
      lines();
    }

    async function submit() {
      clearError();
      submitBtn.disabled = true;
      fill(status, 'Submitting…');
      try {
        const job = await api.post('/v1/jobs', ta.value);
        fill(status);
        U.toast(`Job #${job.id} submitted`, 'ok');
        location.hash = '#/jobs/' + job.id;
      } catch (e) {
        fill(status);
        showError(e);
      } finally {
        submitBtn.disabled = false;
      }
    }

    submitBtn.addEventListener('click', submit);
    ta.addEventListener('input', () => {
      if (errLine) clearError();
      else lines();
      save();
    });
    ta.addEventListener('scroll', () => {
      gutter.scrollTop = ta.scrollTop;
      place();
    });
    ta.addEventListener('keydown', (e) => {
      if (e.key === 'Tab' && !e.shiftKey) {
        e.preventDefault();
        ta.setRangeText('  ', ta.selectionStart, ta.selectionEnd, 'end');
        ta.dispatchEvent(new Event('input'));
      } else if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        submit();
      }
    });

    const from = params.get('from');
    let draft = null;
    try {
      draft = sessionStorage.getItem(DRAFT_KEY);
    } catch (e) { /* ignore */ }
    if (from) {
      load('');
      fill(status, `Loading the spec of job #${from}…`);
      api.get('/v1/jobs/' + encodeURIComponent(from)).then((j) => {
        const spec = j.spec || {};
        load(JSON.stringify(spec, null, 2) + '\n');
        fill(status, `The spec of job #${j.id} (${j.name || 'unnamed'}); change it and submit.`);
      }).catch((e) => showError(e));
    } else {
      load(draft || JSON.stringify(ddpd.templates[0].spec, null, 2) + '\n');
    }
    return () => {};
  }

  /* ---- Devices ------------------------------------------------------------------------------ */

  function devicesView(root) {
    const body = el('div', {class: 'devices'});
    const msg = el('div');
    fill(root, el('div', {class: 'page-head'}, el('h1', {}, 'Devices')), msg, body);
    const names = new Map();

    const gib = (b) => b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(1)} GiB` : `${Math.round(b / 2 ** 20)} MiB`;
    /* A GPU: its model, memory and compute capability as ddpd-worker --devices found them,
     * a badge when it is the emulated device of the tests (DDPD_CUDA_EMU), so that nobody
     * takes it for a GPU, and one when ddpd's CUDA module holds no code for it (no job gets
     * it: docs/api.md, GET /v1/devices). */
    const gpuInfo = (d) => d.name ? el('div', {class: 'device-info muted'}, d.name + (d.memory ? ` · ${gib(d.memory)}` : '')
      + (d.compute_capability ? ` · compute ${d.compute_capability}` : '')) : null;
    const tile = (kind, d) => el('div', {class: 'device' + (d.job ? ' device-busy' : ''), dataset: {kind, index: d.index}},
      el('div', {class: 'device-name'}, kind === 'gpu' ? `GPU ${d.index}` : `CPU slot ${d.index}`,
        kind === 'gpu' && d.emulated ? el('span', {class: 'device-emulated', title: 'an emulated CUDA device (DDPD_CUDA_EMU): for tests, not a real GPU'}, 'emulated') : null,
        kind === 'gpu' && d.has_code === false ? el('span', {class: 'device-emulated device-nocode', title: `ddpd's CUDA module holds no code for compute capability ${d.compute_capability}: no job runs here (rebuild with -DDDPD_CUDA_ARCHS=all)`}, 'no code') : null),
      kind === 'gpu' ? gpuInfo(d) : null,
      d.job ? el('a', {href: '#/jobs/' + d.job, class: 'device-job'}, `#${d.job} ${names.get(d.job) || ''}`)
        : el('div', {class: 'device-free'}, 'free'));

    const group = (title, kind, list) => {
      const busy = list.filter((d) => d.job).length;
      return el('section', {class: 'card'},
        el('h2', {}, title, el('span', {class: 'muted'}, list.length ? ` — ${busy} of ${list.length} in use` : '')),
        list.length ? el('div', {class: 'device-grid'}, list.map((d) => tile(kind, d)))
          : el('p', {class: 'muted'}, kind === 'gpu' ? 'This server has no GPUs.' : 'This server runs no CPU ranks (--cpu-slots 0).'));
    };

    const stop = U.every(2000, async () => {
      let d;
      try {
        d = await api.get('/v1/devices');
        fill(msg);
      } catch (e) {
        if (e.status) fill(msg, errorBox(e));
        throw e;
      }
      const held = new Set([...(d.gpus || []), ...(d.cpu_slots || [])].map((x) => x.job).filter((x) => x && !names.has(x)));
      if (held.size) {
        try {
          const r = await api.get('/v1/jobs?state=starting,running&limit=200');
          for (const j of r.jobs) names.set(j.id, j.name);
        } catch (e) { /* names are a nicety */ }
      }
      fill(body, group('GPUs', 'gpu', d.gpus || []), group('CPU slots', 'cpu', d.cpu_slots || []));
    });
    return stop;
  }

  ddpd.views = {jobs: jobsView, submit: submitView, devices: devicesView, locate, parsePath};
})();
