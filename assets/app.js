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
