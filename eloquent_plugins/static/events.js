/*
 * Mirrors core/events.py: the kinds of an event (DATA, then one final END or ERROR). A leaf module, separate
 * because the wire format, the control records, the receiver and the client all name the kinds.
 */

export const EventKind = Object.freeze({ DATA: 0, END: 1, ERROR: 2 });
