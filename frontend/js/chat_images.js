// Pictures in chat: attach (button or paste) up to four images to the next question, shown as
// thumbnails under the composer and in the turn. Each is scaled down in a canvas and sent as a
// data:image URL with the prompt frame; the server keeps them with the question, so they show
// again when the chat reopens, and hands them to a vision model as image parts.
import { h, toast } from "./util.js";

const MAX_IMAGES = 4;
const MAX_SIDE = 512;  // pixels: a model's image processor shrinks pictures further anyway
const QUALITY = 0.85;

async function scaled(file) {
  const bitmap = await createImageBitmap(file);
  const ratio = Math.min(1, MAX_SIDE / Math.max(bitmap.width, bitmap.height));
  const canvas = h("canvas", { width: Math.round(bitmap.width * ratio), height: Math.round(bitmap.height * ratio) });
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  return canvas.toDataURL(file.type === "image/png" ? "image/png" : "image/jpeg", QUALITY);
}

// The attach button, the strip of pending thumbnails, and `take()`, which empties the strip
// and answers the data URLs for the prompt frame.
export function imageAttacher(input) {
  const pending = [];
  const strip = h("div", { class: "attachments", "aria-label": "Attached images", hidden: true });
  const picker = h("input", { type: "file", accept: "image/*", multiple: true, hidden: true,
    "aria-label": "Attach images", onchange: () => { add([...picker.files]); picker.value = ""; } });
  const button = h("button", { type: "button", class: "attach", title: "Attach images (or paste one)",
    "aria-label": "Attach images", onclick: () => picker.click() }, "+");

  function paint() {
    strip.replaceChildren(...pending.map((url, i) => h("span", { class: "thumb" },
      h("img", { src: url, alt: `Attached image ${i + 1}` }),
      h("button", { type: "button", class: "small", "aria-label": `Remove image ${i + 1}`,
        onclick: () => { pending.splice(i, 1); paint(); } }, "×"))));
    strip.hidden = pending.length === 0;
  }

  async function add(files) {
    for (const file of files.filter((f) => f.type.startsWith("image/"))) {
      if (pending.length >= MAX_IMAGES) { toast(`At most ${MAX_IMAGES} images per message`); break; }
      try { pending.push(await scaled(file)); } catch { toast(`${file.name || "The image"} could not be read`); }
    }
    paint();
  }

  input.addEventListener("paste", (e) => {
    const files = [...(e.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
    if (files.length) { e.preventDefault(); add(files); }
  });

  return {
    button, picker, strip,
    take() { const urls = pending.splice(0); paint(); return urls; },
  };
}

// Thumbnails of a stored question's pictures (`meta.images`), or null.
export function turnImages(item) {
  const urls = item.images || item.meta?.images;
  if (!Array.isArray(urls) || !urls.length) return null;
  return h("div", { class: "turn-images" },
    ...urls.map((url, i) => h("a", { href: url, target: "_blank", rel: "noopener" },
      h("img", { src: url, alt: `Image ${i + 1} of this message` }))));
}
