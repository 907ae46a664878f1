// The entry module, served at /eloquent/client.js: the client (eloquent.js) and eloquentFetch (fetch.js), which
// builds on it. Two modules so that eloquentFetch imports the client without a cycle; one entry for pages.
export * from "./eloquent.js";
export * from "./fetch.js";
