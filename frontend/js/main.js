// The router: hash routes, one page module each; theme and menu. The chat is not torn down with its page:
// dock.js keeps it (and its socket) for the whole app and shows it on #/chat or in the dock. Each route change
// fires `hearth:route` on window ({ route, view }) once the page is built.
import { mountDock } from "./dock.js";
import { statusPage } from "./status.js";
import { modelsPage } from "./models.js";
import { jobsPage } from "./jobs.js";
import { adaptersPage } from "./adapters.js";
import { settingsPage } from "./settings.js";
import { wizardPage } from "./wizards.js";
import { memoryPage } from "./memory.js";
import { lineagePage } from "./lineage.js";

const PAGES = {
  status: statusPage, models: modelsPage, jobs: jobsPage, adapters: adaptersPage,
  settings: settingsPage, finetune: (m) => wizardPage(m, "finetune"), quantize: (m) => wizardPage(m, "quantize"),
  dataset: (m) => wizardPage(m, "dataset"), memory: memoryPage, lineage: lineagePage,
};
let cleanup = null;
const dock = mountDock();

function route() {
  const [name, ...rest] = (location.hash.replace(/^#\/?/, "") || "chat").split("/");
  const page = PAGES[name] ? name : "chat";
  if (typeof cleanup === "function") cleanup();
  cleanup = null;
  const main = document.getElementById("main");
  if (page === "chat") dock.place("chat", main);
  else {
    dock.place(page);  // the chat leaves the page before the page is emptied
    main.replaceChildren();
    cleanup = PAGES[page](main, rest);
  }
  for (const a of document.querySelectorAll(".top nav a")) {
    const on = a.getAttribute("href") === `#/${page}`;
    a.classList.toggle("active", on);
    if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  document.querySelector(".top nav").classList.remove("open");
  document.title = `Hearth · ${page[0].toUpperCase()}${page.slice(1)}`;
  const view = rest.filter(Boolean).join("/");
  dispatchEvent(new CustomEvent("hearth:route", { detail: view ? { route: page, view } : { route: page } }));
}

function theme() {
  const saved = localStorage.getItem("hearth-theme");
  if (saved) document.documentElement.dataset.theme = saved;
  const sync = () => {
    const t = document.documentElement.dataset.theme;
    const dark = t ? t === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
    document.getElementById("hljs-light").media = dark ? "not all" : "all";
    document.getElementById("hljs-dark").media = dark ? "all" : "not all";
  };
  sync();
  document.querySelector(".theme").addEventListener("click", () => {
    const dark = document.documentElement.dataset.theme
      ? document.documentElement.dataset.theme === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
    document.documentElement.dataset.theme = dark ? "light" : "dark";
    localStorage.setItem("hearth-theme", document.documentElement.dataset.theme);
    sync();
  });
}

document.querySelector(".menu").addEventListener("click", (e) => {
  const nav = document.querySelector(".top nav");
  nav.classList.toggle("open");
  e.currentTarget.setAttribute("aria-expanded", nav.classList.contains("open"));
});
// With a key required, the header offers Sign out (the session cookie is HttpOnly: /auth says whether it is set).
async function account() {
  let state;
  try { state = await (await fetch("/auth")).json(); } catch { return; }
  if (!state.keyRequired || !state.signedIn) return;
  const button = document.createElement("button");
  button.className = "signout"; button.type = "button"; button.textContent = "Sign out";
  button.addEventListener("click", async () => {
    await fetch("/signout", { method: "POST", headers: { accept: "application/json" } });
    location.assign("/signin");
  });
  document.querySelector(".theme").after(button);
}

addEventListener("hashchange", route);
theme();
route();
account();
if ("serviceWorker" in navigator && (location.protocol === "https:" || ["localhost", "127.0.0.1"].includes(location.hostname))) {
  navigator.serviceWorker.register("/sw.js").catch(() => {});
}
