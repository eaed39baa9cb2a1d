"""Clicks on HTML the app renders (a message's `‹ 2/3 ›`, a token in the token view), relayed to
a Gradio event: rendered HTML cannot hold a component, so one page-wide listener (capture phase,
so the clicked component's own handler does not also fire) finds the clicked element, works out
what was clicked from its classes (`value`, a JS function of the element and the event; null
ignores the click), leaves that in `window.__lp_<key>` and clicks the tab's hidden button, whose
event reads it (`inputs_js`: its js runs before the handler and gives the handler its inputs).
"""

from __future__ import annotations


def relay_js(key: str, target: str, container: str, button: str, value: str) -> str:
    """The listener, installed once per page: a click on an element matching CSS `target`
    inside the element with id `container` + N clicks the element with id `button` + N."""
    return f"""() => {{ if (window.__lpRelay_{key}) return; window.__lpRelay_{key} = true;
  document.addEventListener('click', (e) => {{
    const el = e.target.closest ? e.target.closest('{target}') : null;
    if (!el) return;
    let box = el.parentElement;
    while (box && !/^{container}\\d+$/.test(box.id)) box = box.parentElement;
    const value = box ? ({value})(el, e) : null;
    const go = box ? document.getElementById('{button}' + box.id.slice({len(container)})) : null;
    if (value === null || !go) return;
    e.stopPropagation(); e.preventDefault();
    window.__lp_{key} = value;
    go.click();
  }}, true);
}}"""


def inputs_js(key: str, before: int = 0) -> str:
    """The hidden button's js: its first `before` inputs as they are, then what the listener
    left ('' if nothing)."""
    args = [f"a{k}" for k in range(before)]
    left = f"window.__lp_{key} || ''"
    return f"({', '.join([*args, '_'])}) => [{', '.join([*args, left])}]"
