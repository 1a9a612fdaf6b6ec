/* api.js — the ddpd REST API (schema/README.md, docs/architecture.md) as the dashboard uses it: where the server
 * is, the bearer token, requests with their errors, a job's event stream, and an NDJSON answer.
 *
 * The server: `?api=http://host:port` in the page's address (kept in localStorage), else
 * the one set in the "Server" dialog, else the server that served the page (a page opened
 * from a file URL asks for http://127.0.0.1:8080). Such a cross-origin page needs the
 * server started with `--cors-origin '*'`.
 *
 * The token: asked for when a request gets 401, kept in sessionStorage (this tab only).
 * Event streams use EventSource without a token (it resumes with Last-Event-ID by itself);
 * with one, EventSource cannot send the header, so the stream is read with fetch() and
 * parsed here, resuming with Last-Event-ID the same way. An NDJSON answer to a POST
 * (generate's tokens) is read the same way, line by line (postLines). */
'use strict';
(function () {
  const ddpd = (window.ddpd = window.ddpd || {});
  const BASE_KEY = 'ddpd.api', TOKEN_KEY = 'ddpd.token';
  const bus = (ddpd.bus = ddpd.bus || new EventTarget());

  class ApiError extends Error {
    constructor(status, code, message, path, extra) {
      super(message);
      this.status = status;
      this.code = code;
      this.path = path || '';
      Object.assign(this, extra || {});
    }
  }

  function served() {
    return location.protocol === 'http:' || location.protocol === 'https:';
  }

  function cleanBase(v) {
    return String(v || '').trim().replace(/\/+$/, '');
  }

  (function initBase() {
    const q = new URLSearchParams(location.search).get('api');
    if (q !== null) {
      try {
        if (q) localStorage.setItem(BASE_KEY, cleanBase(q));
        else localStorage.removeItem(BASE_KEY);
      } catch (e) { /* storage off: the query parameter still counts below */ }
    }
  })();

  function storedBase() {
    const q = new URLSearchParams(location.search).get('api');
    if (q !== null) return cleanBase(q);
    try {
      return cleanBase(localStorage.getItem(BASE_KEY));
    } catch (e) {
      return '';
    }
  }

  /* '' means the page's own server. */
  function base() {
    const b = storedBase();
    if (b) return b;
    return served() ? '' : 'http://127.0.0.1:8080';
  }

  function setBase(v) {
    try {
      if (cleanBase(v)) localStorage.setItem(BASE_KEY, cleanBase(v));
      else localStorage.removeItem(BASE_KEY);
    } catch (e) { /* ignore */ }
  }

  function describeBase() {
    return base() || location.origin;
  }

  function crossOrigin() {
    const b = base();
    if (!b) return false;
    try {
      return new URL(b).origin !== location.origin;
    } catch (e) {
      return true;
    }
  }

  function url(path) {
    return base() + path;
  }

  function token() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch (e) {
      return '';
    }
  }

  function setToken(t) {
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* ignore */ }
  }

  /* ---- reachability: the page shows a banner while the server cannot be reached ---- */

  let reachable = null;

  function setReachable(ok, detail) {
    if (ok === reachable && ok) return;
    reachable = ok;
    bus.dispatchEvent(new CustomEvent('connection', {detail: {ok, message: detail || ''}}));
  }

  function unreachableMessage() {
    let m = `Cannot reach the ddpd server at ${describeBase()}.`;
    if (crossOrigin()) m += ` If it is running, start it with --cors-origin '*' so that this page may use it.`;
    return m;
  }

  /* ---- the token prompt (app.js sets ddpd.api.askToken; one prompt at a time) ---- */

  let asking = null, declined = false;

  /* Resolves true when a token was entered. After the user declines, 401s fail at once
   * (no prompt every poll) until tokenWanted() is called. */
  function needToken(message) {
    if (declined) return Promise.resolve(false);
    if (!asking) {
      const ask = ddpd.api.askToken || (async () => false);
      asking = Promise.resolve(ask(message)).then((ok) => {
        declined = !ok;
        if (!ok) bus.dispatchEvent(new CustomEvent('auth', {detail: {message}}));
        return ok;
      }).finally(() => {
        asking = null;
      });
    }
    return asking;
  }

  async function errorOf(res) {
    let body = null;
    try {
      body = await res.json();
    } catch (e) { /* not JSON */ }
    const e = body && body.error ? body.error : {};
    const extra = body && body.error ? {body: body.error} : {};
    /* A 503 says when to try again (cross-origin too: the server exposes the header). */
    const ra = res.headers.get('Retry-After');
    if (ra !== null && ra !== '') extra.retryAfter = Number(ra);
    return new ApiError(res.status, e.code || 'http_' + res.status,
      e.message || `${res.status} ${res.statusText}`, e.path || '', extra);
  }

  /* One request. Resolves with the parsed JSON (text for text/plain, null without a
   * body); rejects with an ApiError (status 0 when the server cannot be reached). A 401
   * asks for a token and tries again. opts: {json, signal, raw, headers}. */
  async function request(method, path, opts) {
    opts = opts || {};
    for (let attempt = 0; ; attempt++) {
      const headers = Object.assign({}, opts.headers || {});
      const t = token();
      if (t) headers.Authorization = 'Bearer ' + t;
      let body;
      if (opts.json !== undefined) {
        body = typeof opts.json === 'string' ? opts.json : JSON.stringify(opts.json);
        headers['Content-Type'] = 'application/json';
      }
      let res;
      try {
        res = await fetch(url(path), {method, headers, body, signal: opts.signal, cache: 'no-store'});
      } catch (e) {
        if (e && e.name === 'AbortError') throw e;
        setReachable(false, unreachableMessage());
        throw new ApiError(0, 'unreachable', unreachableMessage(), '');
      }
      setReachable(true);
      if (res.status === 401 && attempt < 10) {
        const err = await errorOf(res);
        if (await needToken(t ? 'The token was not accepted: ' + err.message : err.message)) continue;
        throw err;
      }
      if (!res.ok) throw await errorOf(res);
      if (opts.raw) return res;
      if (res.status === 204 || res.status === 202) return null;
      const ct = res.headers.get('Content-Type') || '';
      if (ct.includes('json')) return res.json();
      return res.text();
    }
  }

  /* POSTs `json` to `path` and reads its NDJSON answer (generate with "stream": true)
   * through the body's reader: onLine(object) for each line, in order. Resolves at the
   * answer's end; rejects with an ApiError when the request fails (a 401 asks for a token
   * first, as request() does), with the AbortError when opts.signal aborts (the connection
   * closes: the server sees the client go), or with what onLine throws, which closes the
   * connection too. */
  async function postLines(path, json, opts, onLine) {
    const res = await request('POST', path, {json, signal: opts && opts.signal, raw: true,
      headers: {Accept: 'application/x-ndjson'}});
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '', finished = false;
    const each = (line) => {
      if (line.trim() !== '') onLine(JSON.parse(line));
    };
    try {
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          each(line);
        }
      }
      each(buf);
      finished = true;
    } finally {
      if (!finished) reader.cancel().catch(() => {});
    }
  }

  /* ---- event streams ---- */

  const FINAL = new Set(['succeeded', 'failed', 'cancelled']);

  /* Follows job `id`'s events from after sequence number `after`: history, then live.
   * h.onEvent(ev) gets each event object once, in order (seq is deduplicated across
   * reconnects); h.onStatus(s) gets 'connecting', 'live', 'reconnecting', 'ended' or
   * 'error'. The stream ends by itself after the job's final state event. Returns
   * {close()}. */
  function stream(id, after, h) {
    let lastSeq = after || 0, closed = false, es = null, ctrl = null, timer = null, retryMs = 1000;
    const path = `/v1/jobs/${id}/events`;
    const status = (s, e) => h.onStatus && h.onStatus(s, e);

    function handle(data) {
      let ev;
      try {
        ev = JSON.parse(data);
      } catch (e) {
        return;
      }
      if (typeof ev.seq === 'number') {
        if (ev.seq <= lastSeq) return;
        lastSeq = ev.seq;
      }
      h.onEvent(ev);
      if (ev.event === 'state' && FINAL.has(ev.state)) end('ended');
    }

    function cleanup() {
      if (es) es.close();
      es = null;
      if (ctrl) ctrl.abort();
      ctrl = null;
      if (timer) clearTimeout(timer);
      timer = null;
    }

    function end(s, e) {
      if (closed) return;
      closed = true;
      cleanup();
      status(s, e);
    }

    function retry() {
      if (closed || timer) return;
      status('reconnecting');
      timer = setTimeout(async () => {
        timer = null;
        if (closed) return;
        /* Find out why (a token to ask for, a job that is gone) before trying again. */
        try {
          await request('GET', `/v1/jobs/${id}`);
        } catch (e) {
          if (e.status === 404) return end('error', e);
          if (e.status === 401) return end('error', e);
        }
        start();
      }, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    }

    function startEventSource() {
      const first = lastSeq;
      const u = url(path) + (first ? `?after=${first}` : '');
      es = new EventSource(u);
      const onFrame = (e) => handle(e.data);
      for (const name of ['state', 'start', 'loss', 'join', 'eval', 'checkpoint', 'done', 'message'])
        es.addEventListener(name, onFrame);
      es.addEventListener('open', () => {
        retryMs = 1000;
        status('live');
      });
      es.addEventListener('error', (e) => {
        if (e instanceof MessageEvent && typeof e.data === 'string') return handle(e.data); /* a rank's error event */
        if (closed) return;
        /* EventSource reconnects by itself with Last-Event-ID, unless the server answered
         * with an error; but an `after` in the URL would win over the header: reopen. */
        if (es.readyState === EventSource.CLOSED || (first && lastSeq !== first)) {
          es.close();
          es = null;
          retry();
        } else {
          status('reconnecting');
        }
      });
    }

    async function startFetch() {
      ctrl = new AbortController();
      const headers = {Accept: 'text/event-stream'};
      const t = token();
      if (t) headers.Authorization = 'Bearer ' + t;
      if (lastSeq) headers['Last-Event-ID'] = String(lastSeq);
      let res;
      try {
        res = await fetch(url(path), {headers, signal: ctrl.signal, cache: 'no-store'});
      } catch (e) {
        if (!closed) retry();
        return;
      }
      if (res.status === 401) {
        const err = await errorOf(res);
        if (await needToken(err.message)) return closed ? undefined : start();
        return end('error', err);
      }
      if (!res.ok) {
        const err = await errorOf(res);
        if (res.status === 404) return end('error', err);
        return retry();
      }
      retryMs = 1000;
      status('live');
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '', data = [];
      try {
        for (;;) {
          const {value, done} = await reader.read();
          if (done || closed) break;
          buf += value;
          let i;
          while ((i = buf.indexOf('\n')) >= 0) {
            let line = buf.slice(0, i);
            buf = buf.slice(i + 1);
            if (line.endsWith('\r')) line = line.slice(0, -1);
            if (line === '') {
              if (data.length) handle(data.join('\n'));
              data = [];
              if (closed) break;
            } else if (line[0] !== ':') {
              const c = line.indexOf(':');
              const field = c < 0 ? line : line.slice(0, c);
              const v = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
              if (field === 'data') data.push(v);
              /* `id` is the event's seq, which handle() reads from the data; `event`
               * names the event, which the data says too. */
            }
          }
        }
      } catch (e) {
        /* the connection broke: resume below */
      }
      if (!closed) {
        ctrl = null;
        retry();
      }
    }

    function start() {
      if (closed) return;
      status('connecting');
      if (token() || typeof EventSource === 'undefined') startFetch();
      else startEventSource();
    }

    start();
    return {close: () => end('closed')};
  }

  ddpd.api = {
    ApiError, base, setBase, describeBase, crossOrigin, url, token, setToken, request, postLines, stream,
    askToken: null,
    tokenWanted: () => {
      declined = false;
    },
    get: (p, o) => request('GET', p, o),
    post: (p, json, o) => request('POST', p, Object.assign({json}, o || {})),
    del: (p, o) => request('DELETE', p, o),
  };
})();
