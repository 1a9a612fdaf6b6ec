/* sample.js — a job's trained model put to use on its page (docs/api.md, "POST
 * /v1/jobs/{id}/generate" and "POST /v1/jobs/{id}/predict"):
 *   - the Sample box of a GPT job (a model that starts with `embedding` and ends in logits
 *     over the vocabulary): a prompt and the sampling's knobs, the text streamed token by
 *     token as NDJSON, a Stop button that closes the connection (the server then cancels
 *     the generation), and the answer's summary;
 *   - the Predictions panel of a classifier (loss cross_entropy, not a GPT): the model on
 *     the first samples of the job's eval data, each with its label and a mark when the
 *     predicted class is wrong.
 * Which model: the server's choice (the final model, else the newest checkpoint), named in
 * the answer. The model's output is untrusted text: it goes into text nodes only. */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});
  const U = ddpd.util, api = ddpd.api;
  const {el, fill} = U;

  /* The first and last layers of the model's top level (a preset's: the list it expanded to). */
  function ends(spec) {
    const model = spec && spec.model;
    const m = Array.isArray(model) ? model : model && Array.isArray(model.expanded) ? model.expanded : [];
    return m.length ? [m[0], m[m.length - 1]] : [null, null];
  }

  /* The vocabulary of a model generate can run on, as the server decides it: embedding
   * first, a linear as wide as the embedding's `num` last, loss cross_entropy. 0 otherwise. */
  function gptVocab(spec) {
    const [first, last] = ends(spec);
    if (!first || first.type !== 'embedding' || !last || last.type !== 'linear') return 0;
    return spec.loss === 'cross_entropy' && last.out === first.num ? first.num : 0;
  }

  /* What the job's page offers: 'sample' (a GPT), 'predict' (another cross_entropy model),
   * or null. */
  function kind(spec) {
    if (!spec) return null;
    if (gptVocab(spec)) return 'sample';
    return spec.loss === 'cross_entropy' ? 'predict' : null;
  }

  /* "model final (step 300)", "model ckpt-40 (step 40)". */
  function modelLabel(a) {
    const step = a.step === null || a.step === undefined ? '' : ` (step ${U.fmtInt(a.step)})`;
    return `model ${a.model || '?'}${step}`;
  }

  /* "0.0042 s", "1.3 s", "12.5 s". */
  function seconds(s) {
    const v = Number(s);
    if (!Number.isFinite(v)) return '? s';
    return (v >= 10 ? v.toFixed(1) : String(Number(v.toPrecision(2)))) + ' s';
  }

  /* An error of generate or predict, as the box shows it: [title, message]. `e` is an
   * ApiError, or the error object of a stream's last line (code, message, path). */
  function describe(e) {
    const code = e.code || '', msg = e.message || String(e);
    if (code === 'no_model' || e.status === 409) return ['No model yet', msg];
    if (code === 'busy' || e.status === 503) {
      const ra = Number(e.retryAfter);
      return ['The server is busy', msg.replace(/[.\s]*$/, '.') + (ra > 0 ? ` Retry after ${ra} s.` : '')];
    }
    if (code === 'invalid_spec' || e.status === 422) {
      /* The server's message starts with the path it names: said once, in the title. */
      const p = e.path || '';
      return [p ? `Invalid ${p}` : 'Invalid request', p && msg.startsWith(p + ': ') ? msg.slice(p.length + 2) : msg];
    }
    if (e.status === 0) return ['Not reachable', msg];
    return [e.status ? `Error ${e.status} (${code})` : `Error (${code || 'failed'})`, msg];
  }

  function errorBox(box, e, fields) {
    const [title, msg] = describe(e);
    fill(box, el('b', {}, title + ': '), msg);
    box.dataset.code = e.code || '';
    box.dataset.status = e.status === undefined || e.status === null ? '' : String(e.status);
    box.dataset.path = e.path || '';
    box.hidden = false;
    const f = fields && e.path ? fields[e.path.replace(/\[\d+\]$/, '')] : null;
    if (f) {
      f.classList.add('field-error');
      f.setAttribute('aria-invalid', 'true');
    }
  }

  function clearErrors(box, fields) {
    box.hidden = true;
    fill(box);
    for (const f of Object.values(fields || {})) {
      f.classList.remove('field-error');
      f.removeAttribute('aria-invalid');
    }
  }

  /* A number input's value: undefined when empty (the server's default), else the number
   * as typed (the server checks its range and names the field). */
  function numberOf(input) {
    const v = input.value.trim();
    return v === '' ? undefined : Number(v);
  }

  /* ---- the Sample box ---- */

  function sampleCard(id, spec) {
    /* Text in and out: a byte vocabulary, or the job's tokenizer (GPT-2's BPE). */
    const vocab = gptVocab(spec), bytes = vocab === 256 || !!spec.tokenizer;
    const prompt = el('textarea', {id: 'sample-prompt', class: 'sample-prompt mono', rows: '2', spellcheck: 'false',
      placeholder: bytes ? 'text to continue' : `token ids in [0, ${vocab}), e.g. 1, 2, 3`});
    const length = el('input', {type: 'number', id: 'sample-length', min: '1', max: '4096', step: '1', value: '256'});
    const temperature = el('input', {type: 'number', id: 'sample-temperature', min: '0', step: '0.1', value: '1'});
    const topK = el('input', {type: 'number', id: 'sample-top-k', min: '0', step: '1', value: '0'});
    const seed = el('input', {type: 'number', id: 'sample-seed', min: '0', step: '1', placeholder: 'random'});
    const go = el('button', {type: 'button', class: 'primary', id: 'sample-generate'}, 'Generate');
    const stop = el('button', {type: 'button', id: 'sample-stop', disabled: true}, 'Stop');
    const errBox = el('div', {class: 'notice notice-error', id: 'sample-error', role: 'alert', hidden: true});
    const given = el('span', {class: 'sample-given'});
    const made = document.createTextNode('');
    const out = el('pre', {class: 'sample-out mono', id: 'sample-out', hidden: true}, given, el('span', {class: 'sample-new'}, made));
    const summary = el('div', {class: 'sample-summary muted', id: 'sample-summary'});
    const fields = {prompt, ids: prompt, max_new_tokens: length, temperature, top_k: topK, seed};
    const knob = (label, input, title) => el('label', {class: 'knob', title}, label, input);
    const card = el('section', {class: 'card', id: 'sample-card'},
      el('div', {class: 'card-head'}, el('h2', {}, 'Sample'),
        el('span', {class: 'muted'}, (bytes ? 'text' : `token ids (a vocabulary of ${vocab})`) +
          ' from this job\'s model: its final model, else its newest checkpoint')),
      el('label', {class: 'sample-prompt-label'}, bytes ? 'Prompt' : 'Prompt (token ids)', prompt),
      el('div', {class: 'sample-knobs'},
        knob('Length', length, 'max_new_tokens: how many tokens to add (1 to 4096)'),
        knob('Temperature', temperature, '0 is greedy (argmax); higher is more random'),
        knob('Top-k', topK, 'sample among the k likeliest tokens only (0: all)'),
        knob('Seed', seed, 'empty: the server draws one and reports it; the same seed gives the same text'),
        el('span', {class: 'grow'}), go, stop),
      errBox, out, summary);

    let ctrl = null, busy = false, tokens = 0, gone = false;
    /* Tokens' text not yet in the box: the box grows once a frame, not once a token. A
     * token's layout (the scroll position read back) costs more as the text grows; done
     * per token, a stream faster than the page kept its reading loop busy without a break,
     * and nothing was painted until the end. */
    let pending = '', frame = 0;

    function flush() {
      if (frame) cancelAnimationFrame(frame);
      frame = 0;
      if (!pending) return;
      const atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      made.appendData(pending);
      pending = '';
      if (atEnd) out.scrollTop = out.scrollHeight;
      if (busy) fill(summary, `generating… ${U.fmtInt(tokens)} token${tokens === 1 ? '' : 's'}`);
    }

    function queue(text) {
      pending += text;
      if (!frame) frame = requestAnimationFrame(() => {
        frame = 0;
        flush();
      });
    }

    function setBusy(b) {
      busy = b;
      go.disabled = b;
      stop.disabled = !b;
    }

    function showSummary(text, state) {
      fill(summary, text);
      card.dataset.state = state;
    }

    /* The body of the request, or null after showing why it cannot be sent. */
    function body() {
      const b = {stream: true};
      const p = prompt.value;
      if (bytes) {
        b.prompt = p;
      } else {
        const parts = p.split(/[\s,]+/).filter((x) => x !== '');
        if (parts.some((x) => !/^\d+$/.test(x))) {
          errorBox(errBox, {code: 'invalid_spec', path: 'ids', message: 'ids: give token ids, whole numbers separated by commas or spaces'}, fields);
          return null;
        }
        b.ids = parts.map(Number);
      }
      const s = seed.value.trim();
      if (s !== '' && !(Number.isSafeInteger(Number(s)) && Number(s) >= 0)) {
        errorBox(errBox, {code: 'invalid_spec', path: 'seed', message: 'seed: expected a whole number from 0 to 2^53 - 1'}, fields);
        return null;
      }
      for (const [k, input] of [['max_new_tokens', length], ['temperature', temperature], ['top_k', topK], ['seed', seed]]) {
        const v = numberOf(input);
        if (v !== undefined) b[k] = v;
      }
      return b;
    }

    async function generate() {
      if (busy) return;
      clearErrors(errBox, fields);
      const b = body();
      if (!b) return;
      given.textContent = bytes ? b.prompt : b.ids.join(' ') + ' ';
      made.data = '';
      pending = '';
      out.hidden = false;
      tokens = 0;
      delete summary.dataset.seed;
      setBusy(true);
      showSummary('generating…', 'generating');
      ctrl = new AbortController();
      let final = null;
      try {
        await api.postLines(`/v1/jobs/${id}/generate`, b, {signal: ctrl.signal}, (o) => {
          if (o.error) throw Object.assign(new Error(o.error.message), o.error);
          if (o.done) {
            final = o;
          } else if (typeof o.token === 'number') {
            tokens++;
            queue(typeof o.text === 'string' ? o.text : `${o.token} `);
          }
        });
        if (gone) return;
        flush();
        if (!final) throw Object.assign(new Error(`the answer ended after ${tokens} tokens without its summary`), {code: 'inference_failed'});
        /* The final text is the whole of it (a character split across tokens is complete there). */
        if (typeof final.text === 'string' && final.text !== made.data) made.data = final.text;
        const n = Array.isArray(final.ids) ? final.ids.length : tokens;
        const rate = final.seconds > 0 ? ` (${U.fmtRate(n / final.seconds)} tokens/s)` : '';
        const crop = final.cropped ? ` · ${U.fmtInt(final.cropped)} prompt tokens cropped to fit the window` : '';
        summary.dataset.seed = String(final.seed);
        summary.dataset.tokens = String(n);
        showSummary(`${final.cancelled ? 'stopped: ' : ''}${U.fmtInt(n)} token${n === 1 ? '' : 's'} in ${seconds(final.seconds)}${rate}` +
          ` · seed ${final.seed} · ${modelLabel(final)} · prompt ${U.fmtInt(final.prompt_tokens)} tokens${crop}`,
        final.cancelled ? 'stopped' : 'done');
      } catch (e) {
        if (gone) return;
        flush();
        summary.dataset.tokens = String(tokens);
        if (e && e.name === 'AbortError') {
          showSummary(`stopped after ${U.fmtInt(tokens)} token${tokens === 1 ? '' : 's'}`, 'stopped');
        } else {
          if (e instanceof TypeError) e = {code: 'unreachable', message: `the connection broke after ${tokens} tokens (${e.message})`};
          errorBox(errBox, e, fields);
          showSummary(tokens ? `failed after ${U.fmtInt(tokens)} tokens` : '', 'error');
          if (!tokens) out.hidden = true;
        }
      } finally {
        ctrl = null;
        if (!gone) setBusy(false);
      }
    }

    go.addEventListener('click', generate);
    stop.addEventListener('click', () => {
      if (ctrl) ctrl.abort();
    });
    prompt.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) generate();
    });
    card.dataset.state = 'idle';
    return {el: card, destroy: () => {
      gone = true;
      if (frame) cancelAnimationFrame(frame);
      if (ctrl) ctrl.abort();
    }};
  }

  /* ---- the Predictions panel ---- */

  function predictCard(id) {
    const count = el('input', {type: 'number', id: 'predict-count', min: '1', max: '64', step: '1', value: '8'});
    const go = el('button', {type: 'button', id: 'predict-btn'}, 'Predict');
    const errBox = el('div', {class: 'notice notice-error', id: 'predict-error', role: 'alert', hidden: true});
    const body = el('tbody');
    const table = el('div', {class: 'table-wrap', hidden: true}, el('table', {class: 'predictions', id: 'predict-table'},
      el('thead', {}, el('tr', {}, el('th', {class: 'num'}, 'Sample'), el('th', {class: 'num'}, 'Label'),
        el('th', {class: 'num'}, 'Predicted'), el('th', {class: 'num'}, 'Probability'), el('th', {}, ''),
        el('th', {}, 'Next likeliest'))),
      body));
    const summary = el('div', {class: 'muted predict-summary', id: 'predict-summary'});
    const fields = {eval_samples: count};
    const card = el('section', {class: 'card', id: 'predict-card'},
      el('div', {class: 'card-head'}, el('h2', {}, 'Predictions'),
        el('span', {class: 'muted'}, 'the model on the first samples of the job\'s eval data (else its training data)'),
        el('span', {class: 'grow'}),
        el('label', {class: 'knob knob-inline', title: 'how many samples (1 to 64)'}, 'Samples ', count), go),
      errBox, table, summary);
    let gone = false, ctrl = null;
    const pct = (p) => (typeof p === 'number' ? (p * 100).toFixed(1) + '%' : '—');
    const show = (v) => (v === undefined || v === null ? '—' : typeof v === 'object' ? JSON.stringify(v) : String(v));

    function render(r) {
      const top = Array.isArray(r.top) ? r.top : null, labels = Array.isArray(r.labels) ? r.labels : [];
      if (!top) {
        fill(body);
        table.hidden = true;
        fill(summary, `This model's output (shape [${(r.shape || []).join(', ')}]) is not one vector of classes per sample: ` +
          `no classes to show. ${modelLabel(r)}.`);
        return;
      }
      let right = 0, known = 0;
      fill(body, top.map((t, i) => {
        const best = t[0] || {};
        const label = labels[i];
        const has = typeof label === 'number';
        const wrong = has && best.class !== label;
        if (has) {
          known++;
          if (!wrong) right++;
        }
        return el('tr', {dataset: {sample: i, wrong: wrong ? '1' : '0'}, class: wrong ? 'wrong' : ''},
          el('td', {class: 'num'}, String(i)),
          el('td', {class: 'num mono'}, show(label)),
          el('td', {class: 'num mono'}, show(best.class)),
          el('td', {class: 'num'}, pct(best.p)),
          el('td', {class: 'mark', title: has ? (wrong ? 'wrong' : 'right') : 'no label'}, has ? (wrong ? '\u2717' : '\u2713') : ''),
          el('td', {class: 'muted'}, t.slice(1, 4).map((x) => `${x.class} (${pct(x.p)})`).join(', ')));
      }));
      table.hidden = false;
      fill(summary, (known ? `${right} of ${known} right · ` : '') + modelLabel(r));
    }

    async function predict() {
      if (ctrl) return;
      clearErrors(errBox, fields);
      go.disabled = true;
      card.dataset.state = 'busy';
      fill(summary, 'predicting…');
      ctrl = new AbortController();
      try {
        const n = numberOf(count);
        const r = await api.post(`/v1/jobs/${id}/predict`, {eval_samples: n === undefined ? 8 : n}, {signal: ctrl.signal});
        if (gone) return;
        render(r);
        card.dataset.state = 'done';
      } catch (e) {
        if (gone) return;
        fill(body);
        table.hidden = true;
        fill(summary);
        errorBox(errBox, e, fields);
        card.dataset.state = 'error';
      } finally {
        ctrl = null;
        if (!gone) go.disabled = false;
      }
    }
    go.addEventListener('click', predict);
    card.dataset.state = 'idle';
    return {el: card, destroy: () => {
      gone = true;
      if (ctrl) ctrl.abort();
    }};
  }

  /* The card for the job's page (spec as GET /v1/jobs/{id} gives it), or null (also for
   * a caller whose role may not use compute). */
  function card(id, spec) {
    if (ddpd.may && !ddpd.may('submit')) return null; /* a viewer: generate and predict use compute */
    const k = kind(spec);
    if (k === 'sample') return sampleCard(id, spec);
    if (k === 'predict') return predictCard(id);
    return null;
  }

  ddpd.inference = {card, kind, gptVocab};
})();
