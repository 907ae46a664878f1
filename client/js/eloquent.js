// The client's one source is eloquent_plugins/static/ (ES modules, entry eloquent.js): it ships inside the Python
// package (wheel) and `eloquent serve` serves it at /eloquent/client.js. This module re-exports it for node and for
// local imports, with eloquentFetch (fetch.js).
export * from "../../eloquent_plugins/static/client.js";
