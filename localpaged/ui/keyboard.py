"""The chat page's keyboard: the shortcuts (`SHORTCUTS`, one table that the help overlay lists
and KEYBOARD_JS implements), the help overlay (`build_help`: fixed text, opened with `?` or
Ctrl+/ or its button), and a message sent while a reply streams: the send waits for the reply
to end (the events' trigger_mode "always_last", wired in chat/events.py) and a note says so
(QUEUED_NOTE, shown by KEYBOARD_JS until the tab's reply ends).

The shortcuts act on the shown chat tab by clicking its own buttons (`new-chat`, `search`,
`stop{i}`, `regen{i}`, `prev{i}`, `next{i}`), so each does exactly what the button does. Keys
that type (`/`, `?`) count only outside text fields; Escape stops only a streaming reply (it
still closes menus otherwise). The tab order (context/events.py: FOCUS_JS) is the message box,
Send, Stop, then the page in order.
"""

from __future__ import annotations

import html

import gradio as gr

# (keys, what they do); KEYBOARD_JS below implements each row.
SHORTCUTS = [
    ("Enter", "send the message (Shift+Enter: a new line); while a reply streams, it is "
              "sent when the reply ends"),
    ("Esc", "stop the reply that is streaming"),
    ("Alt+R", "regenerate the selected reply"),
    ("Alt+← / Alt+→", "previous / next version of the selected message (‹ ›)"),
    ("Alt+N", "new chat"),
    ("Ctrl+K or /", "search the chats"),
    ("? or Ctrl+/", "show or hide this list"),
]
QUEUED_NOTE = "Queued: your message is sent when the reply ends (Esc stops the reply)."


def help_html() -> str:
    rows = "".join(f"<tr><td><kbd>{html.escape(k)}</kbd></td><td>{html.escape(v)}</td></tr>"
                   for k, v in SHORTCUTS)
    return ("<button class='lp-help-toggle lp-help-btn' type='button'>⌨ Keyboard shortcuts"
            " (?)</button>"
            "<div id='lp-help' class='lp-help' role='dialog' aria-label='Keyboard shortcuts'>"
            "<div class='lp-help-card'><b>Keyboard shortcuts</b>"
            f"<table>{rows}</table>"
            "<button class='lp-help-toggle' type='button'>Close (Esc)</button></div></div>"
            f"<div id='lp-queued' class='lp-queued' role='status'>{html.escape(QUEUED_NOTE)}</div>")


def build_help() -> gr.HTML:
    return gr.HTML(help_html(), elem_id="lp-keys", padding=False)


KEYBOARD_JS = """() => { if (window.__lpKeys) return; window.__lpKeys = true;
  const shownBox = () => [...document.querySelectorAll("[id^='msg'] textarea")]
    .find((t) => t.offsetParent !== null);
  const tab = () => { const t = shownBox(); return t ? t.closest("[id^='msg']").id.slice(3) : null; };
  const streaming = (i) => {
    const c = document.getElementById('chat' + i), b = document.getElementById('tab' + i + '-button');
    return !!c && (c.innerText.includes('▌') || (!!b && b.innerText.includes('●'))); };
  const click = (id) => { const e = document.getElementById(id); if (e) e.click(); };
  const help = () => document.getElementById('lp-help');
  const search = () => document.querySelector('#search textarea, #search input');
  const queued = (i) => { const q = document.getElementById('lp-queued'); if (!q) return;
    q.classList.add('lp-queued-open');
    const t = setInterval(() => { if (!streaming(i)) { q.classList.remove('lp-queued-open');
      clearInterval(t); } }, 300); };
  document.addEventListener('click', (e) => {
    if (e.target.closest && e.target.closest('.lp-help-toggle')) help().classList.toggle('lp-help-open');
  });
  document.addEventListener('keydown', (e) => {
    const typing = !!(e.target.closest && e.target.closest('textarea, input, [contenteditable]'));
    const i = tab(), k = e.key, alt = e.altKey && !e.ctrlKey && !e.metaKey;
    const helpOpen = help() && help().classList.contains('lp-help-open');
    if (k === 'Enter' && !e.shiftKey && i !== null && e.target === shownBox() && streaming(i)) {
      queued(i); return; }                                    // Gradio's submit still runs
    let done = true;
    if (k === 'Escape' && helpOpen) help().classList.remove('lp-help-open');
    else if (k === 'Escape' && i !== null && streaming(i)) click('stop' + i);
    else if (alt && e.code === 'KeyR' && i !== null) click('regen' + i);
    else if (alt && k === 'ArrowLeft' && i !== null) click('prev' + i);
    else if (alt && k === 'ArrowRight' && i !== null) click('next' + i);
    else if (alt && e.code === 'KeyN') click('new-chat');
    else if (((e.ctrlKey || e.metaKey) && k === 'k') || (k === '/' && !typing && !e.ctrlKey)) {
      const s = search(); if (s) s.focus(); }
    else if ((e.ctrlKey && k === '/') || (k === '?' && !typing)) help().classList.toggle('lp-help-open');
    else done = false;
    if (done) { e.preventDefault(); e.stopPropagation(); }
  }, true);
}"""


def wire_keyboard(loaded) -> None:
    """After the page loads: the shortcuts' listener."""
    loaded.then(None, None, None, js=KEYBOARD_JS)
