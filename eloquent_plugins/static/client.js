// The page's entry module, served at /eloquent/client.js: the client's public API (eloquent.js, which re-exports
// the modules beside it) and eloquentFetch (fetch.js). Pages import this one file; the browser fetches the rest.
export * from "./eloquent.js";
export * from "./fetch.js";
