/* The console's "Blocked clients" and "Unauthorized clients" pages: state
 * and methods merged into the tbmqConsole component (app.js), over
 * /api/blocked-clients and /api/unauthorized-clients. */
"use strict";

function clientListsPart() {
  return {
    blocked: [],
    blockForm: {type: "client_id", value: "", regex_target: "client_id", expires: "", description: ""},
    blockError: "",
    unauthorized: {items: [], total: 0, evicted: 0},

    loadBlocked() {
      return this.loadWith(async () => {
        this.blocked = (await this.api("GET", "/api/blocked-clients")).items;
      });
    },

    async addBlocked() {
      const f = this.blockForm;
      this.blockError = "";
      const minutes = f.expires === "" ? null : Number(f.expires);
      if (minutes !== null && !(minutes > 0)) {
        this.blockError = "Expires in: a number of minutes above 0, or empty for never.";
        return;
      }
      const body = {type: f.type, value: f.value.trim(),
                    regex_target: f.type === "regex" ? f.regex_target : null,
                    expires_at: minutes === null ? null : Date.now() / 1000 + minutes * 60,
                    description: f.description.trim() || null};
      this.busy = true;
      try {
        const entry = await this.api("POST", "/api/blocked-clients", body);
        this.flash("blocked " + entry.type + " " + entry.value);
        this.blockForm.value = "";
        this.blockForm.description = "";
        await this.loadBlocked();
      } catch (e) {
        this.blockError = e.message + (e.details && e.details.length ? " — " + e.details.join("; ") : "");
      } finally {
        this.busy = false;
      }
    },

    removeBlocked(entry) {
      return this.act(() => this.api("DELETE", "/api/blocked-clients/" + encodeURIComponent(entry.id)),
                      () => "removed " + entry.type + " " + entry.value, () => this.loadBlocked());
    },

    loadUnauthorized() {
      return this.loadWith(async () => {
        this.unauthorized = await this.api("GET", "/api/unauthorized-clients");
      });
    },

    clearUnauthorized() {
      return this.act(() => this.api("DELETE", "/api/unauthorized-clients"),
                      answer => "cleared " + answer.target + " attempt(s)", () => this.loadUnauthorized());
    },

    until(seconds) {
      return seconds ? new Date(seconds * 1000).toLocaleString() : "never";
    },
  };
}
