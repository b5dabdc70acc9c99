// Markdown for model replies: raw HTML is shown as text, links are
// http(s)/mailto only, code blocks are highlighted with the vendored hljs.
import { h } from "./util.js";

function esc(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

let ready = false;
function setup() {
  if (ready || !window.marked) return;
  window.marked.use({
    gfm: true, breaks: true,
    // marked passes text after an inline HTML tag through unescaped; escape every text token.
    walkTokens(token) { if (token.type === "text") token.escaped = false; },
    renderer: {
      html(token) { return esc(token.text || token.raw || ""); },
      link(token) {
        const href = token.href || "";
        const safe = /^(https?:|mailto:)/i.test(href) ? href : "#";
        return `<a href="${esc(safe)}" target="_blank" rel="noopener noreferrer">${this.parser.parseInline(token.tokens)}</a>`;
      },
      image(token) { return esc(`[image: ${token.text || token.href}]`); },
      code(token) {
        const lang = (token.lang || "").split(/\s/)[0];
        let body = esc(token.text);
        if (window.hljs) {
          try {
            body = lang && window.hljs.getLanguage(lang) ? window.hljs.highlight(token.text, { language: lang }).value
              : window.hljs.highlightAuto(token.text).value;
          } catch { body = esc(token.text); }
        }
        return `<pre><code class="hljs">${body}</code></pre>`;
      },
    },
  });
  ready = true;
}

export function markdown(text) {
  setup();
  const div = h("div", { class: "md" });
  if (window.marked) div.innerHTML = window.marked.parse(text || "");
  else div.textContent = text || "";
  for (const pre of div.querySelectorAll("pre")) {
    const copy = h("button", { class: "copy small", type: "button", "aria-label": "Copy code",
      style: "position:absolute;top:6px;right:6px;font-size:.75rem;padding:1px 6px" }, "Copy");
    copy.addEventListener("click", () => navigator.clipboard?.writeText(pre.innerText.replace(/Copy$/, "")));
    pre.append(copy);
  }
  return div;
}
