// Reloads the data of a page whose <main> has data-refresh (seconds) in
// place, keeping the scroll position; pauses while the tab is hidden.
(function () {
  const first = document.querySelector('main[data-refresh]');
  if (!first) return;
  const every = Math.max(1, Number(first.dataset.refresh)) * 1000;
  setInterval(async function () {
    if (document.hidden) return;
    try {
      const r = await fetch(location.href, {credentials: 'same-origin'});
      if (!r.ok) return;
      const next = new DOMParser().parseFromString(await r.text(), 'text/html').querySelector('main');
      const cur = document.querySelector('main');
      if (next && cur) cur.replaceWith(next);
    } catch (e) { /* the next tick retries */ }
  }, every);
})();
