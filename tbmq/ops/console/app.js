/* The tbmq web console: one Alpine.js component over the REST admin API
 * (/api/, documented at /api/openapi.json), charts drawn with uPlot.
 * The login token is kept in sessionStorage (one browser tab). */
"use strict";

const TOKEN_KEY = "tbmq.token";
const USER_KEY = "tbmq.user";
const POLL_MS = 2000;

class ApiError extends Error {
  constructor(status, message, details) {
    super(message);
    this.status = status;
    this.details = details || [];
  }
}

function chartOptions(title, series, width) {
  return {
    width: width, height: 240, title: "",
    cursor: {drag: {x: false, y: false}},
    legend: {live: false},
    scales: {x: {time: true}, y: {range: (u, min, max) => [0, Math.max(1, max * 1.15)]}},
    axes: [{stroke: "#64748b", grid: {stroke: "#eef2f7"}},
           {stroke: "#64748b", grid: {stroke: "#eef2f7"}, size: 60}],
    series: [{}].concat(series.map(([label, color]) => ({
      label: label, stroke: color, width: 2, fill: color + "18", points: {show: false},
    }))),
  };
}

document.addEventListener("alpine:init", () => {
  Alpine.data("tbmqConsole", () => ({
    token: sessionStorage.getItem(TOKEN_KEY) || "",
    user: JSON.parse(sessionStorage.getItem(USER_KEY) || '{"name":"","role":""}'),
    view: "dashboard",
    titles: {dashboard: "Dashboard", sessions: "Sessions", credentials: "Credentials",
             retained: "Retained messages", nodes: "Nodes", kafka: "Kafka",
             blocked: "Blocked clients", unauthorized: "Unauthorized clients"},
    loginForm: {username: "", password: ""},
    loginError: "",
    error: "",
    notice: "",
    busy: false,
    loading: false,
    snapshot: null,
    cluster: null,
    kafka: null,
    history: [],
    rates: {received: null, sent: null, dropped: null},
    failedLogins: {lastMinute: 0},
    sessions: {items: [], total: 0, offset: 0, limit: 50},
    sessionQuery: {q: "", connected: "", offset: 0},
    selected: null,
    credentials: [],
    form: null,
    formError: "",
    retained: {items: [], total: 0, offset: 0, limit: 50},
    retainedQuery: {filter: "#", offset: 0},
    nodes: [],
    confirm: null,
    charts: {},
    timer: null,

    // -- life cycle -----------------------------------------------------------

    boot() {
      window.addEventListener("hashchange", () => this.route());
      window.addEventListener("resize", () => this.resizeCharts());
      this.route();
    },

    route() {
      const name = (location.hash || "#/dashboard").replace(/^#\//, "").split("?")[0];
      this.view = this.titles[name] ? name : "dashboard";
      this.error = "";
      this.notice = "";
      if (this.token) this.load();
    },

    load() {
      clearInterval(this.timer);
      this.timer = null;
      if (this.view === "dashboard") {
        this.loadDashboard();
        this.timer = setInterval(() => this.loadDashboard(), POLL_MS);
      } else if (this.view === "sessions") {
        this.loadSessions();
      } else if (this.view === "credentials") {
        this.loadCredentials();
      } else if (this.view === "retained") {
        this.loadRetained();
      } else if (this.view === "nodes") {
        this.loadNodes();
        this.timer = setInterval(() => this.loadNodes(), 5000);
      } else if (this.view === "blocked") {
        this.loadBlocked();
      } else if (this.view === "unauthorized") {
        this.loadUnauthorized();
      } else if (this.view === "kafka") {
        this.loadKafka();
        this.timer = setInterval(() => this.loadKafka(), 5000);
      }
    },

    // -- the API ----------------------------------------------------------------

    async api(method, path, body) {
      const headers = {"Accept": "application/json"};
      if (this.token) headers["Authorization"] = "Bearer " + this.token;
      if (body !== undefined) headers["Content-Type"] = "application/json";
      let response;
      try {
        response = await fetch(path, {method, headers,
                                      body: body === undefined ? undefined : JSON.stringify(body)});
      } catch (e) {
        throw new ApiError(0, "The node does not answer (" + e.message + ").");
      }
      let data = null;
      try { data = await response.json(); } catch (e) { data = null; }
      if (!response.ok) {
        const err = (data && data.error) || {};
        const failure = new ApiError(response.status, err.message || response.statusText, err.details);
        if (response.status === 401 && path !== "/api/auth/login") {
          this.signedOut("Your session has ended: " + failure.message);
        }
        throw failure;
      }
      return data;
    },

    async loadWith(work) {
      this.loading = true;
      try {
        await work();
      } catch (e) {
        this.fail(e);
      } finally {
        this.loading = false;
      }
    },

    // a change: ``work()``, then the notice ``message(answer)`` and ``then()``
    async act(work, message, then) {
      try {
        const answer = await work();
        this.flash(message(answer));
        await then();
      } catch (e) {
        this.fail(e);
      }
    },

    fail(e) {
      if (e.status === 401) return;
      this.error = e.message + (e.details && e.details.length ? " — " + e.details.join("; ") : "");
    },

    flash(text) {
      this.notice = text;
      setTimeout(() => { if (this.notice === text) this.notice = ""; }, 3500);
    },

    // -- login ------------------------------------------------------------------

    async login() {
      this.busy = true;
      this.loginError = "";
      try {
        const answer = await this.api("POST", "/api/auth/login", this.loginForm);
        this.token = answer.token;
        this.user = answer.user;
        sessionStorage.setItem(TOKEN_KEY, this.token);
        sessionStorage.setItem(USER_KEY, JSON.stringify(this.user));
        this.loginForm.password = "";
        if (!location.hash || location.hash === "#/login") location.hash = "#/dashboard";
        this.$nextTick(() => this.route());
      } catch (e) {
        this.loginError = e.message;
      } finally {
        this.busy = false;
      }
    },

    signedOut(message) {
      clearInterval(this.timer);
      this.timer = null;
      this.destroyCharts();
      this.token = "";
      sessionStorage.removeItem(TOKEN_KEY);
      sessionStorage.removeItem(USER_KEY);
      this.loginError = message || "";
    },

    logout() { this.signedOut(""); },

    // -- dashboard ----------------------------------------------------------------

    async loadDashboard() {
      try {
        const [snapshot, history, cluster] = await Promise.all([
          this.api("GET", "/api/metrics"), this.api("GET", "/api/metrics/history"),
          this.api("GET", "/api/metrics/cluster")]);
        this.snapshot = snapshot;
        this.history = history.points;
        // the cluster's rates: the live nodes' heartbeat counters summed
        this.cluster = cluster;
        this.rates = {received: cluster.rates.received, sent: cluster.rates.sent,
                      dropped: cluster.rates.dropped};
        // refused CONNECTs over the last minute, from the per-second rates
        const recent = history.points.filter(p => p.t > snapshot.time - 60);
        this.failedLogins = {lastMinute: Math.round(
          recent.reduce((n, p) => n + p.auth_failures * history.interval, 0))};
        this.$nextTick(() => this.drawCharts());
      } catch (e) {
        this.fail(e);
      }
    },

    drawCharts() {
      // both charts are the cluster's: the live nodes' heartbeat figures summed
      const cp = this.cluster ? this.cluster.points : [];
      const t = cp.map(p => p.t);
      const messages = [t, cp.map(p => p.received), cp.map(p => p.sent), cp.map(p => p.dropped)];
      const clients = [t, cp.map(p => p.connections), cp.map(p => p.sessions)];
      this.chart("messages", [["in", "#2563eb"], ["out", "#16a34a"], ["dropped", "#dc2626"]], messages);
      this.chart("clients", [["connections (cluster)", "#7c3aed"], ["sessions (cluster)", "#ea580c"]], clients);
    },

    chart(name, series, data) {
      const host = document.getElementById("chart-" + name);
      if (!host || !window.uPlot) return;
      const existing = this.charts[name];
      if (existing && existing.root.isConnected) {
        existing.setData(data);
        return;
      }
      host.innerHTML = "";
      this.charts[name] = new uPlot(chartOptions(name, series, Math.max(280, host.clientWidth)), data, host);
    },

    resizeCharts() {
      for (const [name, chart] of Object.entries(this.charts)) {
        const host = document.getElementById("chart-" + name);
        if (host && chart.root.isConnected) chart.setSize({width: Math.max(280, host.clientWidth), height: 240});
      }
    },

    destroyCharts() {
      for (const chart of Object.values(this.charts)) chart.destroy();
      this.charts = {};
    },

    // -- sessions -------------------------------------------------------------------

    loadSessions() {
      const q = new URLSearchParams({offset: this.sessionQuery.offset, limit: 50});
      if (this.sessionQuery.q) q.set("q", this.sessionQuery.q);
      if (this.sessionQuery.connected) q.set("connected", this.sessionQuery.connected);
      return this.loadWith(async () => {
        this.sessions = await this.api("GET", "/api/sessions?" + q);
        if (this.selected && !this.sessions.items.some(s => s.client_id === this.selected.session.client_id)) {
          this.selected = null;
        }
      });
    },

    async showSession(clientId) {
      try {
        this.selected = await this.api("GET", "/api/sessions/" + encodeURIComponent(clientId));
      } catch (e) {
        this.fail(e);
      }
    },

    disconnectSession(clientId) {
      return this.act(
        () => this.api("POST", "/api/sessions/" + encodeURIComponent(clientId) + "/disconnect"),
        answer => clientId + (answer.status === "disconnected" ? " disconnected" : " is being disconnected"),
        async () => {
          await this.loadSessions();  // a non-persistent session ends with its connection
          if (this.sessions.items.some(s => s.client_id === clientId)) await this.showSession(clientId);
        });
    },

    removeSession(clientId) {
      return this.act(
        () => this.api("DELETE", "/api/sessions/" + encodeURIComponent(clientId)),
        () => "session " + clientId + " removed",
        () => { this.selected = null; return this.loadSessions(); });
    },

    // -- credentials ------------------------------------------------------------------

    loadCredentials() {
      return this.loadWith(async () => {
        this.credentials = (await this.api("GET", "/api/credentials")).items;
      });
    },

    editCredentials(c) {
      this.formError = "";
      const mode = rules => rules === null || rules === undefined ? "any" : (rules.length ? "some" : "none");
      this.form = c === null ? {
        id: null, original: null, type: "basic", name: "", client_type: "DEVICE", client_id: "",
        username: "", password: "", cn: "", cn_regex: false, algorithm: "SHA256",
        pubMode: "any", pub: "", subMode: "any", sub: "",
      } : {
        id: c.id, original: c, type: c.type, name: c.name, client_type: c.client_type,
        client_id: c.client_id || "", username: c.username || "", password: "",
        cn: c.cn || "", cn_regex: c.cn_regex, algorithm: c.algorithm || "SHA256",
        pubMode: mode(c.pub), pub: (c.pub || []).join("\n"),
        subMode: mode(c.sub), sub: (c.sub || []).join("\n"),
      };
    },

    formBody() {
      const f = this.form;
      const lines = text => text.split("\n").map(s => s.trim()).filter(Boolean);
      const rules = (mode, text) => mode === "any" ? null : (mode === "none" ? [] : lines(text));
      const body = {name: f.name.trim(), client_type: f.client_type,
                    pub: rules(f.pubMode, f.pub), sub: rules(f.subMode, f.sub)};
      if (!f.id) body.type = f.type;
      if (f.type === "basic") {
        body.client_id = f.client_id.trim() || null;
        body.username = f.username.trim() || null;
        if (f.password) body.password = f.password;
      } else if (f.type === "scram") {
        body.username = f.username.trim();
        if (!f.id || f.algorithm !== f.original.algorithm) body.algorithm = f.algorithm;
        if (f.password) body.password = f.password;
      } else {
        body.cn = f.cn.trim();
        body.cn_regex = !!f.cn_regex;
      }
      if (this.form.pubMode === "some" && !body.pub.length) throw new Error("Give at least one publish regex, or choose 'nothing'.");
      if (this.form.subMode === "some" && !body.sub.length) throw new Error("Give at least one subscribe regex, or choose 'nothing'.");
      return body;
    },

    async saveCredentials() {
      this.formError = "";
      let body;
      try { body = this.formBody(); } catch (e) { this.formError = e.message; return; }
      this.busy = true;
      try {
        const saved = this.form.id
          ? await this.api("PATCH", "/api/credentials/" + encodeURIComponent(this.form.id), body)
          : await this.api("POST", "/api/credentials", body);
        this.flash((this.form.id ? "changed " : "added ") + saved.name);
        this.form = null;
        await this.loadCredentials();
      } catch (e) {
        this.formError = e.message + (e.details && e.details.length ? " — " + e.details.join("; ") : "");
      } finally {
        this.busy = false;
      }
    },

    deleteCredentials(c) {
      return this.act(() => this.api("DELETE", "/api/credentials/" + encodeURIComponent(c.id)),
                      () => "deleted " + c.name, () => this.loadCredentials());
    },

    // -- retained messages -------------------------------------------------------------

    loadRetained() {
      const q = new URLSearchParams({filter: this.retainedQuery.filter || "#",
                                     offset: this.retainedQuery.offset, limit: 50});
      return this.loadWith(async () => {
        try {
          this.retained = await this.api("GET", "/api/retained?" + q);
        } catch (e) {
          this.retained = {items: [], total: 0, offset: 0, limit: 50};  // no stale rows
          throw e;
        }
      });
    },

    deleteRetained(topic) {
      return this.act(() => this.api("DELETE", "/api/retained?" + new URLSearchParams({topic})),
                      () => "deleted the retained message of " + topic, () => this.loadRetained());
    },

    // -- nodes --------------------------------------------------------------------------

    loadNodes() {
      return this.loadWith(async () => {
        this.nodes = (await this.api("GET", "/api/nodes")).items;
      });
    },

    // -- kafka ---------------------------------------------------------------------------

    loadKafka() {
      return this.loadWith(async () => {
        this.kafka = await this.api("GET", "/api/kafka");
      });
    },

    // one row per consumer group and topic (a group without offsets: one row)
    groupRows() {
      if (!this.kafka) return [];
      const rows = [];
      for (const g of this.kafka.consumer_groups) {
        const topics = g.topics.length ? g.topics : [null];
        topics.forEach((t, i) => rows.push({key: g.group + "\u0000" + (t ? t.topic : ""),
                                             group: g, topic: t, first: i === 0}));
      }
      return rows;
    },

    partitionLags(partitions) {
      const known = n => n === null ? "?" : n;
      return partitions.map(p => p.partition + ": " + known(p.committed) + " / " + known(p.latest)
                                 + " → " + known(p.lag)).join(", ");
    },

    offsets(list) {
      const shown = list.slice(0, 12).map(o => o === null ? "?" : o).join(", ");
      return list.length > 12 ? shown + ", …" : shown;
    },

    // -- helpers ---------------------------------------------------------------------

    confirmThen(title, text, run) { this.confirm = {title, text, run}; },

    fmt(value) {
      if (value === null || value === undefined) return "–";
      return value >= 100 ? Math.round(value).toLocaleString() : value.toFixed(1);
    },

    count(n) {
      return n === null || n === undefined ? "–" : Number(n).toLocaleString();
    },

    bytes(n) {
      if (n < 1024) return n + " B";
      if (n < 1048576) return (n / 1024).toFixed(1) + " kB";
      return (n / 1048576).toFixed(1) + " MB";
    },

    ago(seconds) {
      if (!seconds) return "–";
      const d = Date.now() / 1000 - seconds;
      if (d < 5) return "just now";
      if (d < 60) return Math.round(d) + " s ago";
      if (d < 3600) return Math.round(d / 60) + " min ago";
      if (d < 86400) return Math.round(d / 3600) + " h ago";
      return new Date(seconds * 1000).toLocaleString();
    },

    expiry(seconds) {
      if (seconds >= 4294967295) return "never";
      if (seconds < 120) return seconds + " s";
      if (seconds < 7200) return Math.round(seconds / 60) + " min";
      return Math.round(seconds / 3600) + " h";
    },

    // the reasons with drops, most first
    droppedReasons() {
      if (!this.snapshot) return [];
      return Object.entries(this.snapshot.node.dropped_by_reason)
        .filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
    },

    // what a credentials record matches, in words (not its internal id)
    identity(c) {
      if (c.type === "x509") return "certificate CN " + (c.cn_regex ? "matching " : "") + (c.cn || "–");
      const parts = [];
      if (c.username) parts.push("user name " + c.username);
      if (c.client_id) parts.push("client id " + c.client_id);
      return parts.length ? parts.join(", ") : "any client";
    },

    rules(patterns) {
      if (patterns === null || patterns === undefined) return "any";
      if (!patterns.length) return "nothing";
      return patterns.join(", ");
    },

    ...clientListsPart(),  // client-lists.js
  }));
});
