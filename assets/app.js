// Keyboard shortcuts for the playground: S (or Alt+→) steps one round, R runs to the end, Escape stops.
// They only fire when focus is not in a text field, so typing a prompt never triggers them.
(() => {
  const BUTTONS = { s: "sd-step", r: "sd-run", Escape: "sd-stop" };

  function isTyping(el) {
    if (!el) return false;
    if (el.isContentEditable) return true;
    const tag = el.tagName;
    return tag === "TEXTAREA" || tag === "SELECT" || (tag === "INPUT" && !["checkbox", "radio", "button", "range"].includes(el.type));
  }

  function button(id) {
    const el = document.getElementById(id);
    if (!el) return null;
    const btn = el.tagName === "BUTTON" ? el : el.querySelector("button");
    // offsetParent is null when the Playground tab is hidden: shortcuts act only on what is on screen.
    return btn && btn.offsetParent !== null && !btn.disabled ? btn : null;
  }

  document.addEventListener("keydown", (e) => {
    if (e.defaultPrevented || e.repeat || e.ctrlKey || e.metaKey || isTyping(e.target)) return;
    let id = null;
    if (e.altKey && e.key === "ArrowRight") id = BUTTONS.s;
    else if (!e.altKey && !e.shiftKey) id = BUTTONS[e.key.length === 1 ? e.key.toLowerCase() : e.key];
    const btn = id && button(id);
    if (!btn) return;
    e.preventDefault();
    btn.click();
  });
})();

// Release each Plotly chart the page drops. Gradio's Plot component mounts a fresh chart for every new figure
// (a keyed block) and never calls Plotly.purge on the old one, whose window "resize" listener (the chart is
// responsive) keeps it, its DOM and its own listeners alive. A playground run updates the charts ~14 times, so
// without this the page grew by ~5,000 nodes and ~1,000 listeners a run, and its main-thread work per run grew
// with them (2.4 s on the first run, 4.9 s on the sixth, same run).
(() => {
  function purge(el) {
    if (el.isConnected || !window.Plotly) return;  // moved rather than dropped, or Plotly never loaded
    try { window.Plotly.purge(el); } catch (_) { /* a chart that never finished drawing */ }
  }
  new MutationObserver((records) => {
    for (const record of records) {
      for (const node of record.removedNodes) {
        if (node.nodeType !== 1) continue;
        if (node.classList.contains("js-plotly-plot")) purge(node);
        else if (node.firstElementChild) node.querySelectorAll(".js-plotly-plot").forEach(purge);
      }
    }
  }).observe(document.documentElement, { childList: true, subtree: true });
})();
