/* vmr-handler timeline: layout to the window, zoom, pan, filter and details.
 *
 * Loaded inline by the report of `vmr-host report` and from /static/timeline.js by the live
 * console. No dependency, nothing fetched.
 *
 *   VmrTimeline.attach(element) -> controller
 *
 * `element` is the fragment's root `<div class="vmr-tl">` or any element holding one (the
 * first found is used). Attaching the same root again returns its controller. When the
 * console replaces the fragment by a new one and attaches that, the zoom window, filter text,
 * state filter and the expanded group are carried over (kept per parent element, else the
 * last one used); a zoom window that ended at the old end of the data follows the new end.
 *
 * The server lays the chart out for a nominal plot width; every element carries its times
 * (`data-s`, `data-e`: seconds after the root's `data-origin`) and is laid out here again:
 * rect from s to e (at least 1 px, 2 px for entries and lateness), path/circle moved to s,
 * line at s, text from s (hidden when s..e is narrower than `data-w`). Only the lanes on
 * screen are laid out at once; the others when they scroll into view.
 */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var NICE = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120,
    300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];
  var TICK_PX = 110;      /* about one tick per this many px (as axis.py) */
  var LABEL_MARGIN = 36;  /* no tick label closer to the plot's edges (px) */
  var MIN_SPAN = 0.002;   /* narrowest zoom window, s */
  var MARGIN_PX = 300;    /* lanes this far off screen are laid out too */
  var memory = typeof WeakMap === "function" ? new WeakMap() : null;
  var lastState = null;
  var controllers = [];
  var detail = null;
  var dragging = null;  /* the controller whose chart is being dragged */

  function num(v, d) { var x = parseFloat(v); return isFinite(x) ? x : d; }

  function secs(a) { /* >= 120 s, as text.py _secs */
    if (a < 7200) {
      var m = Math.floor(a / 60), s = Math.floor(a % 60);
      return s ? m + "m " + (s < 10 ? "0" : "") + s + "s" : m + "m";
    }
    var h = Math.floor(a / 3600), mm = Math.floor((a % 3600) / 60);
    return mm ? h + "h " + (mm < 10 ? "0" : "") + mm + "m" : h + "h";
  }

  function relLabel(d, step) {
    var a = Math.abs(d);
    if (a < step / 1000) { return "t=0"; }
    var sign = d > 0 ? "+" : "-";
    if (a >= 120 && step >= 1) { return "t=" + sign + secs(a); }
    var dec = step >= 1 ? 0 : Math.min(3, Math.ceil(-Math.log(step) / Math.LN10 - 1e-9));
    return "t=" + sign + a.toFixed(dec) + " s";
  }

  function utcLabel(t, step, span) {
    var iso = new Date(Math.round(t * 1000)).toISOString();
    if (span > 2 * 86400) { return iso.slice(5, 10) + " " + iso.slice(11, 16); }
    if (step < 1) { return iso.slice(11, 19) + iso.slice(19, step >= 0.1 ? 21 : 23); }
    return iso.slice(11, 19);
  }

  function ticks(t0, t1, start, width) {
    var span = t1 - t0, step = null, i;
    for (i = 0; i < NICE.length; i++) {
      if (span / NICE[i] <= width / TICK_PX) { step = NICE[i]; break; }
    }
    if (step === null) { step = NICE[NICE.length - 1] * Math.ceil(span / NICE[NICE.length - 1] / 10); }
    var base = start === null ? 0 : start;
    var k = Math.ceil((t0 - base) / step - 1e-9), out = [];
    while (base + k * step <= t1 && out.length < 1000) { out.push(base + k * step); k++; }
    return { step: step, at: out };
  }

  function svgEl(tag, attrs, text) {
    var el = document.createElementNS(NS, tag), k;
    for (k in attrs) { if (Object.prototype.hasOwnProperty.call(attrs, k)) { el.setAttribute(k, attrs[k]); } }
    if (text !== undefined) { el.textContent = text; }
    return el;
  }

  function Controller(root) {
    this.root = root;
    this.t0 = num(root.getAttribute("data-t0"), 0);
    this.t1 = num(root.getAttribute("data-t1"), 1);
    this.origin = num(root.getAttribute("data-origin"), this.t0);
    this.start = root.hasAttribute("data-start") ? num(root.getAttribute("data-start"), null) : null;
    this.axisCell = root.querySelector(".tl-axcell");
    this.axis = root.querySelector("svg.tl-axis");
    this.over = root.querySelector("svg.tl-over");
    this.lanesEl = root.querySelector(".tl-lanes");
    this.shownEl = root.querySelector(".tl-shown");
    this.dateEl = root.querySelector(".tl-axlabel .tk");
    this.filterEl = root.querySelector("input.tl-filter");
    this.lanes = [];
    this.agg = null;
    var rows = root.querySelectorAll(".tl-lane"), i;
    for (i = 0; i < rows.length; i++) {
      var el = rows[i];
      if (el.hasAttribute("data-agg")) { this.agg = { el: el, items: null, ver: -1 }; continue; }
      this.lanes.push({ el: el, vm: (el.getAttribute("data-vm") || "").toLowerCase(),
        cat: el.getAttribute("data-cat") || "", grp: el.hasAttribute("data-grp"), items: null, ver: -1 });
    }
    this.state = { v0: null, v1: null, filter: "", cat: "", expanded: false };
    this.ver = 0;
    this.width = 0;
    this.pending = false;
    this.layoutMs = 0;
    this.drag = null;
    this.dragged = false;
  }

  Controller.prototype.view = function () {
    return this.state.v0 === null ? [this.t0, this.t1] : [this.state.v0, this.state.v1];
  };

  Controller.prototype.x = function (rel) { /* seconds after origin -> px */
    var v = this.view();
    var x = (this.origin + rel - v[0]) * this.width / (v[1] - v[0]);
    return x < -50 ? -50 : x > this.width + 50 ? this.width + 50 : x;
  };

  Controller.prototype.parse = function (holder) {
    var els = holder.querySelectorAll("[data-s]"), items = [], i;
    for (i = 0; i < els.length; i++) {
      var el = els[i], tag = el.tagName.toLowerCase(), cls = el.getAttribute("class") || "";
      var kind = tag === "rect" ? 0 : tag === "line" ? 2 : tag === "text" ? 3 : 1;
      items.push({ el: el, k: kind, s: num(el.getAttribute("data-s"), 0), e: num(el.getAttribute("data-e"), NaN),
        w: num(el.getAttribute("data-w"), 0), m: (cls.indexOf("e-") === 0 || cls === "late") ? 2 : 1 });
    }
    return items;
  };

  Controller.prototype.place = function (items) {
    var i, it, x, x2;
    for (i = 0; i < items.length; i++) {
      it = items[i];
      x = this.x(it.s);
      if (it.k === 0) {
        x2 = isNaN(it.e) ? x : this.x(it.e);
        it.el.setAttribute("x", x.toFixed(1));
        it.el.setAttribute("width", Math.max(x2 - x, it.m).toFixed(1));
      } else if (it.k === 1) {
        it.el.setAttribute("transform", "translate(" + x.toFixed(1) + ",0)");
      } else if (it.k === 2) {
        it.el.setAttribute("x1", x.toFixed(1));
        it.el.setAttribute("x2", x.toFixed(1));
      } else {
        x2 = isNaN(it.e) ? x : this.x(it.e);
        it.el.setAttribute("x", (x + 2).toFixed(1));
        it.el.setAttribute("visibility", x2 - x >= it.w ? "visible" : "hidden");
      }
    }
  };

  Controller.prototype.placeLane = function (lane) {
    if (lane.items === null) { lane.items = this.parse(lane.el); }
    this.place(lane.items);
    lane.ver = this.ver;
  };

  Controller.prototype.drawAxis = function () {
    var v = this.view(), w = this.width, t = ticks(v[0], v[1], this.start, w), self = this;
    var tg = this.axis && this.axis.querySelector(".tl-ticks");
    var gg = this.over && this.over.querySelector(".tl-grid");
    var k = w / (v[1] - v[0]), h = num(this.axis && this.axis.getAttribute("height"), 40);
    if (tg) { while (tg.firstChild) { tg.removeChild(tg.firstChild); } }
    if (gg) { while (gg.firstChild) { gg.removeChild(gg.firstChild); } }
    t.at.forEach(function (tick) {
      var px = (tick - v[0]) * k, x = px.toFixed(1);
      if (tg) {
        tg.appendChild(svgEl("line", { x1: x, x2: x, y1: h - 7, y2: h, "class": "tick" }));
        if (px >= LABEL_MARGIN && px <= w - LABEL_MARGIN) {
          tg.appendChild(svgEl("text", { x: x, y: 13, "class": "tk" }, utcLabel(tick, t.step, v[1] - v[0])));
          if (self.start !== null) {
            tg.appendChild(svgEl("text", { x: x, y: 26, "class": "tk2" }, relLabel(tick - self.start, t.step)));
          }
        }
      }
      if (gg) { gg.appendChild(svgEl("line", { x1: x, x2: x, y1: 0, y2: "100%", "class": "grid" })); }
    });
    if (this.dateEl) { this.dateEl.textContent = "UTC " + new Date(v[0] * 1000).toISOString().slice(0, 10); }
    if (this.axis) { this.place(this.axisItems || (this.axisItems = this.parse(this.axis))); }
    if (this.over) { this.place(this.overItems || (this.overItems = this.parse(this.over))); }
  };

  /* Lay out the lanes on screen (and MARGIN_PX around) that are not laid out for this view. */
  Controller.prototype.refresh = function () {
    if (!this.width || !this.lanesEl) { return; }
    var vh = window.innerHeight || document.documentElement.clientHeight;
    var box = this.lanesEl.getBoundingClientRect();
    if (box.bottom < -MARGIN_PX || box.top > vh + MARGIN_PX) { return; }
    var todo = [], i, lane, top;
    var all = this.agg ? this.lanes.concat([this.agg]) : this.lanes;
    for (i = 0; i < all.length; i++) {  /* reads first, then writes: one layout */
      lane = all[i];
      if (lane.ver === this.ver || lane.el.hidden) { continue; }
      top = box.top + lane.el.offsetTop;
      if (top + lane.el.offsetHeight > -MARGIN_PX && top < vh + MARGIN_PX) { todo.push(lane); }
    }
    for (i = 0; i < todo.length; i++) { this.placeLane(todo[i]); }
  };

  Controller.prototype.layout = function () {
    var began = window.performance ? performance.now() : 0;
    var w = this.axisCell ? this.axisCell.clientWidth : 0;
    if (!w) { return; }  /* not displayed yet: the ResizeObserver calls again */
    this.width = w;
    this.ver++;
    this.drawAxis();
    this.refresh();
    this.layoutMs = window.performance ? performance.now() - began : 0;
  };

  Controller.prototype.schedule = function () {
    var self = this;
    if (this.pending) { return; }
    this.pending = true;
    window.requestAnimationFrame(function () { self.pending = false; self.layout(); });
  };

  Controller.prototype.setView = function (v0, v1) {
    var full = this.t1 - this.t0, span = Math.max(v1 - v0, MIN_SPAN);
    if (span >= full) {
      this.state.v0 = this.state.v1 = null;
    } else {
      if (v0 < this.t0) { v0 = this.t0; }
      if (v0 + span > this.t1) { v0 = this.t1 - span; }
      this.state.v0 = v0;
      this.state.v1 = v0 + span;
    }
    this.save();
    this.schedule();
  };

  /* Zoom by `factor` (< 1: in) around the fraction `at` (0..1) of the plot's width. */
  Controller.prototype.zoom = function (factor, at) {
    var f = at === undefined ? 0.5 : at, v = this.view(), span = v[1] - v[0];
    var c = v[0] + f * span, next = Math.max(span * factor, MIN_SPAN);
    this.setView(c - f * next, c - f * next + next);
  };

  Controller.prototype.pan = function (seconds) {
    var v = this.view();
    if (this.state.v0 !== null) { this.setView(v[0] + seconds, v[1] + seconds); }
  };

  Controller.prototype.applyFilter = function () {
    if (this.state.cat && !this.root.querySelector('.tl-count[data-cat="' + this.state.cat + '"]')) {
      this.state.cat = "";  /* no VM is in that state any more (a new fragment): show them all */
    }
    var q = this.state.filter.trim().toLowerCase(), cat = this.state.cat, active = !!(q || cat);
    var shown = 0, i, lane, show;
    for (i = 0; i < this.lanes.length; i++) {
      lane = this.lanes[i];
      show = (!q || lane.vm.indexOf(q) >= 0) && (!cat || lane.cat === cat) &&
        (active || !lane.grp || this.state.expanded);
      if (lane.el.hidden === show) { lane.el.hidden = !show; }
      if (show) { shown++; }
    }
    if (this.agg) {
      this.agg.el.hidden = active;
      var b = this.agg.el.querySelector(".tl-expand");
      if (b) {
        b.setAttribute("aria-expanded", this.state.expanded ? "true" : "false");
        b.textContent = b.textContent.replace(/^[\u25b8\u25be]/, this.state.expanded ? "\u25be" : "\u25b8");
      }
    }
    this.root.classList.remove("tl-collapsed");
    var counts = this.root.querySelectorAll(".tl-count");
    for (i = 0; i < counts.length; i++) {
      counts[i].setAttribute("aria-pressed", counts[i].getAttribute("data-cat") === cat ? "true" : "false");
    }
    if (this.filterEl && this.filterEl.value !== this.state.filter) { this.filterEl.value = this.state.filter; }
    if (this.shownEl) {
      this.shownEl.textContent = shown === this.lanes.length ? shown + " shown" : shown + " of " + this.lanes.length + " shown";
    }
    var table = this.root.getAttribute("data-table") && document.getElementById(this.root.getAttribute("data-table"));
    if (table) {
      var rows = table.querySelectorAll("tr[data-vm]");
      for (i = 0; i < rows.length; i++) {
        show = (!q || rows[i].getAttribute("data-vm").toLowerCase().indexOf(q) >= 0) &&
          (!cat || rows[i].getAttribute("data-cat") === cat);
        if (rows[i].hidden === show) { rows[i].hidden = !show; }
      }
    }
    this.save();
    this.refresh();
  };

  Controller.prototype.save = function () {
    var s = { v0: this.state.v0, v1: this.state.v1, filter: this.state.filter, cat: this.state.cat,
      expanded: this.state.expanded, t1: this.t1 };
    lastState = s;
    if (memory && this.root.parentNode) { memory.set(this.root.parentNode, s); }
  };

  Controller.prototype.restore = function () {
    var s = (memory && this.root.parentNode && memory.get(this.root.parentNode)) || lastState;
    if (!s) { return; }
    this.state.filter = s.filter;
    this.state.cat = s.cat;
    this.state.expanded = s.expanded;
    if (s.v0 !== null) {
      var span = s.v1 - s.v0, v0 = s.v0;
      if (s.v1 >= s.t1 - span * 0.01) { v0 = this.t1 - span; }  /* it showed the end: follow it */
      if (span < this.t1 - this.t0) {
        this.state.v0 = Math.max(v0, this.t0);
        this.state.v1 = this.state.v0 + span;
      }
    }
  };

  Controller.prototype.frac = function (ev) {
    var r = this.axisCell.getBoundingClientRect();
    return r.width ? Math.min(Math.max((ev.clientX - r.left) / r.width, 0), 1) : 0.5;
  };

  Controller.prototype.onWheel = function (ev, onAxis) {
    var unit = ev.deltaMode === 1 ? 16 : ev.deltaMode === 2 ? 400 : 1;
    var dx = ev.deltaX * unit, dy = ev.deltaY * unit, v = this.view();
    if (Math.abs(dx) > Math.abs(dy) || (ev.shiftKey && !ev.ctrlKey)) {
      ev.preventDefault();
      this.pan((Math.abs(dx) > Math.abs(dy) ? dx : dy) * (v[1] - v[0]) / (this.width || 1));
    } else if (onAxis || ev.ctrlKey || ev.metaKey) {
      ev.preventDefault();
      this.zoom(Math.exp(Math.max(Math.min(dy, 300), -300) * 0.002), this.frac(ev));
    }
  };

  Controller.prototype.onClick = function (ev) {
    var t = ev.target, z, c;
    if (this.dragged) { this.dragged = false; return; }
    if ((z = t.closest("[data-zoom]"))) {
      var act = z.getAttribute("data-zoom"), span = this.view()[1] - this.view()[0];
      if (act === "in") { this.zoom(0.5); } else if (act === "out") { this.zoom(2); }
      else if (act === "left") { this.pan(-span / 4); } else if (act === "right") { this.pan(span / 4); }
      else { this.setView(this.t0, this.t1); }
      return;
    }
    if ((c = t.closest(".tl-count"))) {
      this.state.cat = this.state.cat === c.getAttribute("data-cat") ? "" : c.getAttribute("data-cat");
      this.applyFilter();
      return;
    }
    if (t.closest(".tl-expand")) {
      this.state.expanded = !this.state.expanded;
      this.applyFilter();
      return;
    }
    var holder = t.closest("svg.tl-plot *, svg.tl-axis *");
    while (holder && !(holder.firstElementChild && holder.firstElementChild.tagName.toLowerCase() === "title")) {
      holder = holder.parentNode && holder.parentNode.closest ? holder.parentNode.closest("svg.tl-plot *, svg.tl-axis *") : null;
    }
    if (holder) { showDetail(holder.firstElementChild.textContent); }
  };

  Controller.prototype.onDown = function (ev) {
    if (ev.button !== 0 || !ev.target.closest("svg.tl-plot, svg.tl-axis") || this.state.v0 === null) { return; }
    this.drag = { x: ev.clientX, v0: this.state.v0, v1: this.state.v1, id: ev.pointerId, on: false };
    dragging = this;
  };

  Controller.prototype.onMove = function (ev) {
    var d = this.drag;
    if (!d || d.id !== ev.pointerId) { return; }
    var dx = ev.clientX - d.x;
    if (!d.on && Math.abs(dx) > 3) {
      d.on = true;
      this.root.classList.add("tl-dragging");
    }
    if (d.on) {
      var dt = -dx * (d.v1 - d.v0) / (this.width || 1);
      this.setView(d.v0 + dt, d.v1 + dt);
    }
  };

  Controller.prototype.onUp = function (ev) {
    if (this.drag && this.drag.on) { this.dragged = true; }
    this.drag = null;
    dragging = null;
    this.root.classList.remove("tl-dragging");
  };

  Controller.prototype.bind = function () {
    var self = this, root = this.root;
    root.addEventListener("click", function (ev) { self.onClick(ev); });
    if (this.filterEl) {
      this.filterEl.addEventListener("input", function () {
        self.state.filter = self.filterEl.value;
        self.applyFilter();
      });
    }
    if (this.axisCell) {
      this.axisCell.addEventListener("wheel", function (ev) { self.onWheel(ev, true); }, { passive: false });
    }
    if (this.lanesEl) {
      this.lanesEl.addEventListener("wheel", function (ev) { self.onWheel(ev, false); }, { passive: false });
    }
    root.addEventListener("pointerdown", function (ev) { self.onDown(ev); });
  };

  function showDetail(text) {
    if (!detail) {
      detail = document.createElement("div");
      detail.className = "vmr-tl-detail";
      detail.setAttribute("role", "dialog");
      detail.innerHTML = '<button type="button" aria-label="close">\u00d7</button><pre></pre>';
      detail.firstChild.addEventListener("click", function () { detail.hidden = true; });
      document.addEventListener("keydown", function (ev) { if (ev.key === "Escape") { detail.hidden = true; } });
      document.body.appendChild(detail);
    }
    detail.lastChild.textContent = text;
    detail.hidden = false;
  }

  function live() {
    controllers = controllers.filter(function (c) {
      if (c.root.isConnected === false || !document.documentElement.contains(c.root)) {
        if (resizer) { resizer.unobserve(c.root); }
        return false;
      }
      return true;
    });
    return controllers;
  }

  var framed = false;
  function onScroll() {
    if (framed) { return; }
    framed = true;
    window.requestAnimationFrame(function () {
      framed = false;
      live().forEach(function (c) { c.refresh(); });
    });
  }

  var resizer = typeof ResizeObserver === "function" ? new ResizeObserver(function (entries) {
    entries.forEach(function (e) {
      var c = e.target.vmrTimeline;
      if (c && c.axisCell && c.axisCell.clientWidth !== c.width) { c.layout(); }
    });
  }) : null;

  function attach(element) {
    if (!element) { return null; }
    var root = element.classList && element.classList.contains("vmr-tl") ? element : element.querySelector(".vmr-tl");
    if (!root) { return null; }
    if (root.vmrTimeline) { return root.vmrTimeline; }
    var c = new Controller(root);
    root.vmrTimeline = c;
    c.restore();
    c.bind();
    c.applyFilter();
    c.layout();
    live().push(c);
    if (resizer) { resizer.observe(root); }
    return c;
  }

  window.addEventListener("pointermove", function (ev) { if (dragging) { dragging.onMove(ev); } });
  window.addEventListener("pointerup", function (ev) { if (dragging) { dragging.onUp(ev); } });
  window.addEventListener("pointercancel", function (ev) { if (dragging) { dragging.onUp(ev); } });
  window.addEventListener("scroll", onScroll, { capture: true, passive: true });
  window.addEventListener("resize", onScroll);
  window.VmrTimeline = { attach: attach, ticks: ticks, relLabel: relLabel, utcLabel: utcLabel };
}());
