/* app.js — the page's frame: the hash router (#/jobs, #/jobs/7, #/queue, #/submit, #/devices,
 * #/compare?ids=3,5,9, #/sweeps, #/sweeps/3),
 * the connection banner, the token prompt and the server dialog. */
'use strict';
(function () {
  const ddpd = window.ddpd;
  const U = ddpd.util, api = ddpd.api;
  const {el, fill} = U;
  const view = document.getElementById('view');
  let unmount = null;

  function route() {
    const h = location.hash && location.hash !== '#' ? location.hash.slice(1) : '/jobs';
    const [path, query] = h.split('?');
    const params = new URLSearchParams(query || '');
    const parts = path.split('/').filter(Boolean);
    if (unmount) {
      try {
        unmount();
      } catch (e) { /* a view's cleanup must not stop the next view */ }
      unmount = null;
    }
    const section = parts[0] || 'jobs';
    document.title = 'ddpd';
    if (section === 'jobs' && parts.length === 2 && /^[1-9][0-9]{0,18}$/.test(parts[1])) unmount = ddpd.views.job(view, params, parts[1]);
    else if (section === 'jobs' && parts.length === 1) unmount = ddpd.views.jobs(view, params);
    else if (section === 'queue' && parts.length === 1) unmount = ddpd.views.queue(view, params);
    else if (section === 'submit' && parts.length === 1) unmount = ddpd.views.submit(view, params);
    else if (section === 'devices' && parts.length === 1) unmount = ddpd.views.devices(view, params);
    else if (section === 'compare' && parts.length === 1) unmount = ddpd.views.compare(view, params);
    else if (section === 'sweeps' && parts.length === 1) unmount = ddpd.views.sweeps(view, params);
    else if (section === 'sweeps' && parts.length === 2 && /^[1-9][0-9]{0,18}$/.test(parts[1])) unmount = ddpd.views.sweep(view, params, parts[1]);
    else {
      fill(view, el('h1', {}, 'Not found'), el('p', {}, 'No page at ', el('code', {}, '#' + path), '. ',
        el('a', {href: '#/jobs'}, 'Go to the jobs.')));
    }
    for (const a of document.querySelectorAll('nav a')) a.classList.toggle('on', a.dataset.nav === section);
  }

  /* ---- the server: name, reachability ---- */

  const banner = document.getElementById('banner');
  const dot = document.getElementById('conn-dot');
  fill(document.getElementById('server-name'), api.describeBase().replace(/^https?:\/\//, ''));
  ddpd.bus.addEventListener('connection', (e) => {
    const {ok, message} = e.detail;
    dot.className = 'dot ' + (ok ? 'dot-ok' : 'dot-down');
    dot.title = ok ? 'connected' : 'unreachable';
    if (ok) {
      banner.hidden = true;
      fill(banner);
    } else {
      fill(banner, el('b', {}, 'Server unreachable. '), message, ' Retrying every few seconds…');
      banner.hidden = false;
    }
  });

  /* ---- the token prompt ---- */

  const authBanner = document.getElementById('auth-banner');
  ddpd.bus.addEventListener('auth', () => {
    fill(authBanner, el('b', {}, 'This server needs a token. '), 'Requests are refused without one. ',
      el('button', {type: 'button', class: 'small', id: 'enter-token', onclick: () => {
        authBanner.hidden = true;
        api.tokenWanted();
        route();
      }}, 'Enter a token'));
    authBanner.hidden = false;
  });

  const tokenDialog = document.getElementById('token-dialog');
  api.askToken = (message) => new Promise((resolve) => {
    const input = document.getElementById('token-input');
    fill(tokenDialog.querySelector('.token-why'), message || 'The server answered 401.');
    input.value = '';
    tokenDialog.returnValue = '';
    const done = () => {
      tokenDialog.removeEventListener('close', done);
      if (tokenDialog.returnValue === 'ok' && input.value.trim()) {
        api.setToken(input.value.trim());
        ddpd.me = null;
        whoami();
        resolve(true);
      } else resolve(false);
    };
    tokenDialog.addEventListener('close', done);
    tokenDialog.showModal();
    input.focus();
  });

  /* ---- the server dialog ---- */

  const settings = document.getElementById('settings-dialog');
  document.getElementById('server-btn').addEventListener('click', () => {
    document.getElementById('api-input').value = api.base();
    settings.returnValue = '';
    settings.showModal();
  });
  settings.addEventListener('close', () => {
    if (settings.returnValue === 'save') {
      api.setBase(document.getElementById('api-input').value);
      /* Start over against the new server (drop ?api= so it does not win). */
      location.href = location.pathname + location.hash;
    } else if (settings.returnValue === 'forget') {
      api.setToken('');
      U.toast('Token forgotten');
    }
  });

  /* ---- who am I: the header's "name (role)", and the actions the role cannot take hidden
   * (ddpd.me; ddpd.may tells a view whether the caller may act on a job). ---- */

  ddpd.me = null;
  ddpd.may = (action, owner) => {
    const me = ddpd.me;
    if (!me) return true; /* not known yet: the server still refuses what it must */
    if (me.role === 'admin') return true;
    if (me.role === 'viewer') return false;
    return action === 'submit' || owner === me.name;
  };
  async function whoami() {
    try {
      const me = await api.get('/v1/whoami');
      const changed = !ddpd.me || ddpd.me.name !== me.name || ddpd.me.role !== me.role;
      ddpd.me = me;
      fill(document.getElementById('whoami'), `${me.name} (${me.role})`);
      const submit = document.querySelector('nav a[data-nav="submit"]');
      if (submit) submit.hidden = me.role === 'viewer';
      if (changed) route();
    } catch (e) { /* 401: the token prompt asks; unreachable: the banner says so */ }
  }
  ddpd.bus.addEventListener('connection', (e) => {
    if (e.detail.ok && !ddpd.me) whoami();
  });

  window.addEventListener('hashchange', route);
  route();
  whoami();
})();
