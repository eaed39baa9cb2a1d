"""The loading page: what a browser gets while the model loads (localpaged.api.loading serves it).

Plain HTML with one inline script (no Gradio: it is not imported yet). The script polls
`/startup/status` twice a second and shows the model, the phase and its detail, a bar (the
percentage when the phase reports one, else a moving stripe), the time so far and the steps
with their times; when the status says ready it reloads the page, which is then the chat page.
A failed start shows the error. Every text from the server goes in through textContent.
"""

from __future__ import annotations

from localpaged.api.loading import STATUS_PATH

LOADING_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>localpaged · starting</title>
<style>
  :root { color-scheme: light dark; --accent: #f97316; }
  body { font: 15px/1.5 system-ui, sans-serif; margin: 0; display: grid; place-items: center;
         min-height: 100vh; background: Canvas; color: CanvasText; }
  main { width: min(640px, 92vw); }
  h1 { font-size: 1.35rem; margin: 0 0 .25rem; }
  #model { opacity: .75; margin: 0 0 1.2rem; overflow-wrap: anywhere; }
  #phase { font-weight: 600; }
  .bar { height: 8px; border-radius: 4px; background: color-mix(in srgb, CanvasText 12%, Canvas);
         overflow: hidden; margin: .6rem 0; }
  .bar > div { height: 100%; width: 30%; background: var(--accent); border-radius: 4px;
               animation: slide 1.4s ease-in-out infinite; }
  .bar.known > div { animation: none; transition: width .3s; }
  @keyframes slide { from { margin-left: -30%; } to { margin-left: 100%; } }
  #steps { font: 13px/1.45 ui-monospace, monospace; opacity: .8; padding: 0; list-style: none;
           max-height: 40vh; overflow: auto; }
  #error { color: #dc2626; white-space: pre-wrap; }
</style></head>
<body><main id="lp-loading">
  <h1>localpaged is starting</h1>
  <p id="model"></p>
  <div><span id="phase">starting</span> <span id="detail"></span>
       <span id="elapsed" style="float:right"></span></div>
  <div class="bar" id="bar"><div></div></div>
  <p id="error"></p>
  <ol id="steps"></ol>
  <noscript>This page reloads itself when the model is ready; without JavaScript, reload it
  by hand in a minute.</noscript>
</main>
<script>
(() => {
  const $ = (id) => document.getElementById(id);
  async function poll() {
    let s;
    try { s = await (await fetch('STATUS_PATH', {cache: 'no-store'})).json(); }
    catch (e) { $('detail').textContent = '(waiting for the server)'; return setTimeout(poll, 1000); }
    if (s.ready) { location.reload(); return; }
    $('model').textContent = 'Model: ' + s.model;
    $('phase').textContent = s.phase;
    $('detail').textContent = s.detail ? '— ' + s.detail : '';
    $('elapsed').textContent = s.elapsed_s.toFixed(0) + ' s';
    const bar = $('bar'), known = typeof s.percent === 'number';
    bar.classList.toggle('known', known);
    bar.firstElementChild.style.width = known ? Math.min(100, s.percent) + '%' : '';
    const steps = $('steps');
    steps.replaceChildren(...s.steps.map((x) => {
      const li = document.createElement('li');
      li.textContent = x.at_s.toFixed(1) + ' s  ' + x.text;
      return li;
    }));
    steps.scrollTop = steps.scrollHeight;
    if (s.error) { $('error').textContent = 'The app could not start: ' + s.error; return; }
    setTimeout(poll, 500);
  }
  poll();
})();
</script></body></html>
""".replace("STATUS_PATH", STATUS_PATH)
