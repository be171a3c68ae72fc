// pcsd run view: renders the episode records inlined in the page (pcsd/view/page.py), no network.
// The URL's hash keeps the state: colour=gap|weight, failed=1, type=<task type>, from=<step>, to=<step>,
// ep0=<episode>, ep1=<episode> (the selected episode of each run), prompts=open (the prompts shown). #...&selftest=1 runs a check of the
// colour switch and writes its result into <pre id="selftest"> (the browser test reads it).
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("pcsd-data").textContent);
  const RUNS = DATA.runs;
  const state = { colour: "gap", failed: false, type: "", from: null, to: null, sel: RUNS.map(() => null), sync: true, prompts: false };

  // ------------------------------------------------------------------ helpers
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  const fmt = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x) ? "n/a" : Number(x).toFixed(d));
  const pct = (x) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(1) + "%");
  const where = (ep) => (ep.kind === "train" ? "step " + ep.step : ep.eval + " (step " + ep.step + ")");

  function readHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    if (h.get("colour") === "weight" || h.get("colour") === "gap") state.colour = h.get("colour");
    state.failed = h.get("failed") === "1";
    state.prompts = h.get("prompts") === "open";
    state.type = h.get("type") || "";
    state.from = h.get("from") !== null && h.get("from") !== "" ? Number(h.get("from")) : null;
    state.to = h.get("to") !== null && h.get("to") !== "" ? Number(h.get("to")) : null;
    RUNS.forEach((_, r) => {
      const v = h.get("ep" + r);
      state.sel[r] = v === null ? null : Number(v);
    });
    return h;
  }
  function writeHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    h.set("colour", state.colour);
    state.failed ? h.set("failed", "1") : h.delete("failed");
    state.type ? h.set("type", state.type) : h.delete("type");
    state.from !== null ? h.set("from", state.from) : h.delete("from");
    state.to !== null ? h.set("to", state.to) : h.delete("to");
    RUNS.forEach((_, r) => (state.sel[r] !== null ? h.set("ep" + r, state.sel[r]) : h.delete("ep" + r)));
    history.replaceState(null, "", "#" + h.toString());
  }

  // token colours: gap diverging (teacher less likely: red, more likely: blue), weight green
  const GAP_CLIP = 2.0;
  function tokenColour(turn, i) {
    if (state.colour === "weight") {
      const w = turn.weight ? turn.weight[i] : null;
      if (w === null || w === undefined) return "transparent";
      const a = Math.max(0, Math.min(1, w / Math.max(1, turn._wmax || 1)));
      return "rgba(22, 163, 74, " + (0.08 + 0.6 * a).toFixed(3) + ")";
    }
    const g = turn.gap ? turn.gap[i] : null;
    if (g === null || g === undefined) return "transparent";
    const a = Math.min(1, Math.abs(g) / GAP_CLIP);
    return g >= 0 ? "rgba(37, 99, 235, " + (0.08 + 0.6 * a).toFixed(3) + ")" : "rgba(220, 38, 38, " + (0.08 + 0.6 * a).toFixed(3) + ")";
  }
  function tokenTitle(turn, i) {
    const t = JSON.stringify(turn.tokens[i]);
    if (!turn.gap) return "token " + t;
    return ["token " + t, "student log-prob " + fmt(turn.student_logp[i], 4), "teacher log-prob " + fmt(turn.teacher_logp[i], 4),
      "gap " + fmt(turn.gap[i], 4), "weight " + fmt(turn.weight[i], 4)].join("\n");
  }
  function recolour() {
    for (const span of document.querySelectorAll(".tok")) {
      const turn = span._turn;
      span.style.backgroundColor = tokenColour(turn, span._i);
    }
    const bar = document.getElementById("legend-bar");
    bar.style.background = state.colour === "weight"
      ? "linear-gradient(90deg, rgba(22,163,74,.08), rgba(22,163,74,.68))"
      : "linear-gradient(90deg, rgba(220,38,38,.68), rgba(220,38,38,.08) 48%, rgba(37,99,235,.08) 52%, rgba(37,99,235,.68))";
    document.getElementById("legend-lo").textContent = state.colour === "weight" ? "w 0" : "gap -" + GAP_CLIP;
    document.getElementById("legend-hi").textContent = state.colour === "weight" ? "w 1" : "+" + GAP_CLIP;
  }

  // ------------------------------------------------------------------ filters
  function visible(ep) {
    if (state.failed && ep.won) return false;
    if (state.type && ep.task_type !== state.type) return false;
    if (state.from !== null && ep.step < state.from) return false;
    if (state.to !== null && ep.step > state.to) return false;
    return true;
  }

  // ------------------------------------------------------------------ rendering
  function renderSummary(run) {
    const steps = el("table", { class: "steps" },
      el("tr", {}, ...["step", "success", "reward", "gap", "weight", "kl", "valid"].map((h) => el("th", { text: h }))));
    for (const s of run.steps) {
      steps.append(el("tr", {
        class: "pick", title: "show the episodes of step " + s.step,
        onclick: () => { state.from = s.step; state.to = s.step; syncControls(); refresh(); },
      }, el("td", { text: s.step }), el("td", { text: pct(s.success) }), el("td", { text: fmt(s.reward, 2) }),
      el("td", { text: fmt(s.gap_mean) }), el("td", { text: fmt(s.weight_mean) }), el("td", { text: fmt(s.kl, 4) }),
      el("td", { text: fmt(s.valid_actions, 2) })));
    }
    const evals = el("table", { class: "steps" },
      el("tr", {}, ...["evaluation", "step", "success"].map((h) => el("th", { text: h }))));
    for (const e of run.evals) evals.append(el("tr", {}, el("td", { text: e.name }), el("td", { text: e.step }), el("td", { text: pct(e.overall) })));
    return el("div", { class: "summary" },
      el("div", { class: "card" }, el("div", { class: "label", text: "steps (metrics.jsonl)" }),
        run.steps.length ? steps : el("div", { class: "note", text: "no step records" })),
      el("div", { class: "card" }, el("div", { class: "label", text: "evaluations (evals.jsonl)" }),
        run.evals.length ? evals : el("div", { class: "note", text: "no evaluation records" })));
  }

  function renderList(r) {
    const run = RUNS[r];
    const nav = document.getElementById("list" + r);
    nav.replaceChildren();
    let group = null, shown = 0;
    for (const ep of run.episodes) {
      if (!visible(ep)) continue;
      const g = where(ep);
      if (g !== group) { nav.append(el("h3", { text: g })); group = g; }
      shown++;
      nav.append(el("button", {
        class: "item" + (state.sel[r] === ep.id ? " selected" : ""), "data-ep": ep.id,
        title: ep.task, onclick: () => select(r, ep.id, true),
      }, el("span", { class: ep.won ? "won" : "failed", text: ep.won ? "✓ " : "✗ " }),
      ep.task_type + ": " + ep.task));
    }
    if (!shown) nav.append(el("div", { class: "empty", text: "no episode matches the filters" }));
  }

  function markedPrompt(parts, who) {
    const box = el("div", { class: "prompt" });
    box.append(parts.head);
    if (who === "teacher") {
      const extra = parts._teacher_only || "";
      const m = el("mark", { class: "teacher-only", title: "only the teacher sees this (skills, the env's privileged text)" });
      const [hd, ft] = [DATA.privileged_header, DATA.privileged_footer];
      const a = extra.indexOf(hd), b = a >= 0 ? extra.indexOf(ft, a) : -1;
      if (a >= 0 && b >= 0) {
        m.append(extra.slice(0, a),
          el("mark", { class: "privileged", title: "the env's privileged information", text: extra.slice(a, b + ft.length) }),
          extra.slice(b + ft.length));
      } else m.append(extra);
      if (extra) box.append(m);
    } else if (parts.student_only) {
      box.append(el("mark", { class: "student-only", title: "only the student's prompt has this", text: parts.student_only }));
    }
    box.append(parts.tail);
    return box;
  }

  function renderTurn(ep, turn) {
    const head = el("div", { class: "turn-head" },
      el("span", { class: "n", text: "turn " + (turn.turn + 1) }),
      el("span", {}, "action ", el("span", { class: "action", text: turn.action })),
      el("span", { class: turn.valid ? "won" : "invalid", text: turn.valid ? "valid" : "invalid" }),
      el("span", { class: "note", text: "reward " + fmt(turn.reward, 2) }));
    const resp = el("div", { class: "response" });
    if (turn.weight) turn._wmax = Math.max(1, ...turn.weight.filter((w) => w !== null));
    turn.tokens.forEach((t, i) => {
      const s = el("span", { class: "tok", title: tokenTitle(turn, i), "data-i": i }, t === "" ? "∅" : t);
      s._turn = turn; s._i = i;
      if (turn.gap) {
        s.dataset.gap = turn.gap[i]; s.dataset.weight = turn.weight[i];
        s.dataset.studentLogp = turn.student_logp[i]; s.dataset.teacherLogp = turn.teacher_logp[i];
      }
      resp.append(s);
    });
    const box = el("div", { class: "turn" }, head);
    if (turn.observation !== null && turn.observation !== undefined) {
      box.append(el("div", { class: "label", text: "observation" }), el("pre", { class: "obs", text: turn.observation }));
    }
    box.append(el("div", { class: "label", text: ep.token_values ? "response (hover a token for its values)" : "response" }), resp);
    const prompts = el("div", { class: "prompts" },
      el("div", {}, el("div", { class: "label", text: "student's prompt" }), markedPrompt(turn.prompt, "student")));
    if (turn.prompt._teacher_only !== undefined) {
      prompts.append(el("div", {}, el("div", { class: "label", text: "teacher's prompt (teacher-only part marked)" }),
        markedPrompt(turn.prompt, "teacher")));
    }
    box.append(el("details", { open: state.prompts }, el("summary", { text: "prompts" }), prompts));
    return box;
  }

  function renderEpisode(r) {
    const main = document.getElementById("episode" + r);
    main.replaceChildren();
    const ep = state.sel[r] === null ? null : RUNS[r].episodes[state.sel[r]];
    if (!ep) { main.append(el("div", { class: "note", text: "select an episode on the left" })); return; }
    const badges = el("div", { class: "badges" },
      el("span", { class: "badge " + (ep.won ? "good" : "bad"), text: ep.won ? "success" : "failed" }),
      el("span", { class: "badge", text: where(ep) }),
      el("span", { class: "badge", text: ep.task_type }),
      el("span", { class: "badge", text: "reward " + fmt(ep.reward, 2) }),
      ep.score !== null && ep.score !== undefined ? el("span", { class: "badge", text: "score " + fmt(ep.score, 3) }) : null,
      el("span", { class: "badge", text: ep.turns.length + " turns" }),
      ep.env_error ? el("span", { class: "badge bad", text: "env error at step " + ep.env_error_step + ": " + ep.env_error }) : null,
      ep.prompt_overflow ? el("span", { class: "badge bad", text: "prompt over the budget" }) : null);
    main.append(el("div", { class: "episode-head" }, el("h2", { text: ep.task }), badges));
    for (const turn of ep.turns) main.append(renderTurn(ep, turn));
    if (!ep.turns.length) main.append(el("div", { class: "note", text: "no turns (the episode ended before its first response)" }));
    recolour();
  }

  function select(r, id, user) {
    state.sel[r] = id;
    if (user && state.sync && RUNS.length > 1) {
      const ep = RUNS[r].episodes[id];
      RUNS.forEach((other, o) => {
        if (o === r) return;
        const twin = other.episodes.find((x) => x.kind === ep.kind && x.step === ep.step && x.task === ep.task && (x.eval || "") === (ep.eval || ""));
        if (twin) state.sel[o] = twin.id;
      });
    }
    refresh();
  }

  function refresh() {
    RUNS.forEach((_, r) => {
      const ep = state.sel[r] === null ? null : RUNS[r].episodes[state.sel[r]];
      if (!ep || !visible(ep)) {
        const first = RUNS[r].episodes.find(visible);
        state.sel[r] = first ? first.id : null;
      }
      renderList(r);
      renderEpisode(r);
    });
    writeHash();
  }

  // ------------------------------------------------------------------ page
  function syncControls() {
    document.getElementById("colour-" + state.colour).checked = true;
    document.getElementById("failed").checked = state.failed;
    document.getElementById("type").value = state.type;
    document.getElementById("from").value = state.from === null ? "" : state.from;
    document.getElementById("to").value = state.to === null ? "" : state.to;
  }

  function build() {
    const types = [...new Set(RUNS.flatMap((r) => r.episodes.map((e) => e.task_type)))].sort();
    const num = (id) => { const v = document.getElementById(id).value; return v === "" ? null : Number(v); };
    const controls = el("div", { class: "controls" },
      el("span", { class: "switch" }, "colour by ",
        el("label", {}, el("input", { type: "radio", name: "colour", id: "colour-gap", value: "gap",
          onchange: () => { state.colour = "gap"; recolour(); writeHash(); } }), " gap"),
        " ",
        el("label", {}, el("input", { type: "radio", name: "colour", id: "colour-weight", value: "weight",
          onchange: () => { state.colour = "weight"; recolour(); writeHash(); } }), " weight")),
      el("span", { class: "legend" }, el("span", { id: "legend-lo" }), el("span", { class: "bar", id: "legend-bar" }), el("span", { id: "legend-hi" })),
      el("label", {}, el("input", { type: "checkbox", id: "failed", onchange: (e) => { state.failed = e.target.checked; refresh(); } }), " failed only"),
      el("label", {}, "task type ", el("select", { id: "type", onchange: (e) => { state.type = e.target.value; refresh(); } },
        el("option", { value: "", text: "all" }), ...types.map((t) => el("option", { value: t, text: t })))),
      el("label", {}, "steps ", el("input", { type: "number", id: "from", min: 0, placeholder: "from",
        onchange: () => { state.from = num("from"); refresh(); } })),
      el("label", {}, "to ", el("input", { type: "number", id: "to", min: 0, placeholder: "to",
        onchange: () => { state.to = num("to"); refresh(); } })),
      RUNS.length > 1 ? el("label", {}, el("input", { type: "checkbox", id: "sync", checked: true,
        onchange: (e) => { state.sync = e.target.checked; } }), " same task in both") : null);
    const title = RUNS.map((r) => r.name).join(" vs ");
    document.title = "pcsd: " + title;
    const runs = el("div", { class: "runs" + (RUNS.length > 1 ? " compare" : "") });
    RUNS.forEach((run, r) => {
      run.episodes.forEach((ep, i) => {
        ep.id = i;
        let before = "";
        for (const t of ep.turns) {  // the teacher-only text, stored once where it changes
          if (t.prompt.teacher_only !== undefined) before = t.prompt.teacher_only;
          if (t.prompt.teacher_only !== undefined || t.prompt.teacher_only_as_before) t.prompt._teacher_only = before;
        }
      });
      const sub = [run.method && "method " + run.method, run.rule && "rule " + run.rule, run.preset && "preset " + run.preset,
        run.env && "env " + run.env].filter(Boolean).join(", ");
      runs.append(el("section", { class: "run" },
        el("h2", { title: run.path }, run.name + " ", el("span", { class: "sub", text: sub })),
        renderSummary(run),
        el("div", { class: "browser" }, el("nav", { class: "list card", id: "list" + r }), el("main", { class: "episode", id: "episode" + r }))));
    });
    document.body.append(el("header", {}, el("h1", { text: "pcsd · " + title }), controls), runs, el("div", { id: "tip" }));
    // a tooltip that shows at once (the title attribute stays for tools and slow hovers)
    const tip = document.getElementById("tip");
    document.addEventListener("mouseover", (e) => {
      const t = e.target.closest && e.target.closest(".tok");
      if (!t) { tip.style.display = "none"; return; }
      tip.textContent = t.getAttribute("title");
      tip.style.display = "block";
    });
    document.addEventListener("mousemove", (e) => { tip.style.left = e.clientX + 14 + "px"; tip.style.top = e.clientY + 14 + "px"; });
  }

  function selftest() {
    // the switch as a user works it: read the first response's colours, click the other colouring, read again
    const spans = () => [...document.querySelectorAll("#episode0 .tok")];
    const colours = () => spans().map((s) => getComputedStyle(s).backgroundColor);
    const first = state.colour;
    const a = colours();
    document.getElementById(first === "gap" ? "colour-weight" : "colour-gap").click();
    const b = colours();
    const out = {
      episode: state.sel[0], tokens: spans().map((s) => s.textContent), titles: spans().map((s) => s.getAttribute("title")),
      first: first, colours_first: a, second: state.colour, colours_second: b, hash: location.hash,
    };
    document.body.append(el("pre", { id: "selftest", text: JSON.stringify(out) }));
  }

  build();
  const h = readHash();
  syncControls();
  refresh();
  if (h.get("selftest") === "1") selftest();
})();
