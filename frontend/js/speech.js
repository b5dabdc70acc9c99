// Speech input for the chat composer: a hold-to-talk microphone button that
// streams 16 kHz float32 PCM to a live transcription session
// (/v1/audio/sessions) and fills the prompt with the final text, and audio
// files dropped on the chat, transcribed into the prompt. Shown only when the
// server has a Whisper model (GET /v1 says `transcription: true`).
import { api, h, toast } from "./util.js";

const RATE = 16000;
const SEND_EVERY = RATE / 2; // samples per chunk sent while talking (0.5 s)

async function post(path, body, headers = {}) {
  const r = await fetch(path, { method: "POST", body, headers });
  const answer = await r.json().catch(() => null);
  if (!r.ok) throw new Error(answer?.error?.message || `${r.status} ${r.statusText}`);
  return answer;
}

function fill(input, text) {
  const said = (text || "").trim();
  if (!said) { toast("Nothing was heard"); return; }
  input.value = input.value.trim() ? `${input.value.trimEnd()} ${said}` : said;
  input.dispatchEvent(new Event("input"));
  input.focus();
}

// One take: the microphone at 16 kHz, chunks posted in order to one session.
class Take {
  constructor() { this.pending = []; this.queued = 0; this.chain = Promise.resolve(); this.failed = null; }

  async start() {
    const opened = await post("/v1/audio/sessions", JSON.stringify({}), { "content-type": "application/json" });
    this.id = opened.id;
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    this.ctx = new AudioContext({ sampleRate: RATE });
    const source = this.ctx.createMediaStreamSource(this.stream);
    this.node = this.ctx.createScriptProcessor(4096, 1, 1);
    this.node.onaudioprocess = (e) => this.add(new Float32Array(e.inputBuffer.getChannelData(0)));
    source.connect(this.node);
    this.node.connect(this.ctx.destination);
  }

  add(samples) {
    this.pending.push(samples);
    this.queued += samples.length;
    if (this.queued >= SEND_EVERY) this.flush();
  }

  flush() {
    if (!this.queued) return;
    const chunk = new Float32Array(this.queued);
    let at = 0;
    for (const part of this.pending) { chunk.set(part, at); at += part.length; }
    this.pending = []; this.queued = 0;
    const url = `/v1/audio/sessions/${this.id}/audio`;
    this.chain = this.chain.then(() => post(url, chunk.buffer, { "content-type": `audio/pcm;rate=${RATE}` }))
      .catch((e) => { this.failed = e; });
  }

  async finish() {
    await this.opening;  // a quick tap lets go before the session exists
    this.node?.disconnect();
    this.stream?.getTracks().forEach((t) => t.stop());
    await this.ctx?.close();
    this.flush();
    await this.chain;
    if (this.failed) throw this.failed;
    return (await post(`/v1/audio/sessions/${this.id}/finish`, "")).text;
  }

  async cancel() {
    await this.opening?.catch(() => {});
    this.node?.disconnect();
    this.stream?.getTracks().forEach((t) => t.stop());
    if (this.ctx) await this.ctx.close();
    if (this.id) fetch(`/v1/audio/sessions/${this.id}`, { method: "DELETE" }).catch(() => {});
  }
}

function micIcon() {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 24 24"); svg.setAttribute("width", "18"); svg.setAttribute("height", "18");
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS(ns, "path");
  path.setAttribute("fill", "currentColor");
  path.setAttribute("d", "M12 14a3 3 0 0 0 3-3V5a3 3 0 0 0-6 0v6a3 3 0 0 0 3 3zm5-3a5 5 0 0 1-10 0H5a7 7 0 0 0 6 "
    + "6.92V21h2v-3.08A7 7 0 0 0 19 11h-2z");
  svg.append(path);
  return svg;
}

function isAudio(file) {
  return file.type.startsWith("audio/") || /\.(wav|mp3|m4a|aac|flac|ogg|oga|opus|webm|aiff?)$/i.test(file.name);
}

async function transcribeFile(file, input, busy) {
  const form = new FormData();
  form.append("file", file, file.name);
  busy(true);
  try {
    fill(input, (await post("/v1/audio/transcriptions", form)).text);
  } catch (e) {
    toast(`Transcription failed: ${e.message}`);
  } finally { busy(false); }
}

// Adds the microphone button before `before` in `form`, and audio drops on `area`.
export function speechInput({ form, input, before, area }) {
  const mic = h("button", { type: "button", class: "mic", hidden: true, title: "Hold to talk",
    "aria-label": "Hold to talk", "aria-pressed": "false" }, micIcon());
  form.insertBefore(mic, before);
  let take = null;
  const busy = (on) => { mic.disabled = on; mic.classList.toggle("busy", on); };

  async function down(e) {
    e.preventDefault();
    if (take || mic.disabled) return;
    const mine = take = new Take();
    mic.setAttribute("aria-pressed", "true"); mic.classList.add("recording");
    mine.opening = mine.start();
    try { await mine.opening; } catch (err) {
      if (take !== mine) return;  // already let go: up() reports it
      toast(`Microphone: ${err.message}`); await mine.cancel(); take = null;
      mic.setAttribute("aria-pressed", "false"); mic.classList.remove("recording");
    }
  }

  async function up() {
    if (!take) return;
    const current = take; take = null;
    mic.setAttribute("aria-pressed", "false"); mic.classList.remove("recording");
    busy(true);
    try { fill(input, await current.finish()); } catch (err) {
      toast(`Transcription failed: ${err.message}`); await current.cancel();
    } finally { busy(false); }
  }

  mic.addEventListener("pointerdown", down);
  mic.addEventListener("pointerup", up);
  mic.addEventListener("pointerleave", up);
  mic.addEventListener("keydown", (e) => { if ((e.key === " " || e.key === "Enter") && !e.repeat) down(e); });
  mic.addEventListener("keyup", (e) => { if (e.key === " " || e.key === "Enter") up(); });

  area.addEventListener("dragover", (e) => {
    if ([...(e.dataTransfer?.items || [])].some((i) => i.kind === "file" && i.type.startsWith("audio/"))) {
      e.preventDefault();
    }
  });
  area.addEventListener("drop", (e) => {
    const file = [...(e.dataTransfer?.files || [])].find(isAudio);
    if (!file || mic.hidden) return;
    e.preventDefault();
    transcribeFile(file, input, busy);
  });

  api("/v1").then((index) => { mic.hidden = !index.transcription; }).catch(() => {});
  return mic;
}
