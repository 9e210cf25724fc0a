// Server-Sent Events over fetch(): EventSource cannot send an Authorization header, and the
// API key must never travel in a URL. The stream is parsed as the SSE format says
// (event, data, id fields; comments ignored; a blank line ends an event).

export class HttpError extends Error {
  constructor(status, error, message) {
    super(message || error || `HTTP ${status}`);
    this.status = status;
    this.error = error || `HTTP_${status}`;
  }
}

export async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return new HttpError(response.status, body && body.error, (body && body.message) || response.statusText);
}

const MAX_LINE = 1 << 20; // a frame of ours is far smaller; a runaway line ends the stream

// Resolves when the server ends the stream; rejects with HttpError when it refuses it.
export async function streamEvents(url, apiKey, { signal, lastEventId, onEvent, onOpen }) {
  const headers = { Authorization: `Bearer ${apiKey}`, Accept: "text/event-stream" };
  if (lastEventId) headers["Last-Event-ID"] = lastEventId;
  const response = await fetch(url, { headers, signal, cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  if (onOpen) onOpen();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { type: "message", data: [], id: null };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    for (;;) {
      const at = buffer.search(/[\r\n]/);
      if (at < 0) break;
      if (buffer[at] === "\r" && at === buffer.length - 1) break; // "\r\n" may be split across chunks
      const line = buffer.slice(0, at);
      buffer = buffer.slice(at + (buffer[at] === "\r" && buffer[at + 1] === "\n" ? 2 : 1));
      if (line === "") {
        if (event.data.length) onEvent({ type: event.type, data: event.data.join("\n"), id: event.id });
        event = { type: "message", data: [], id: event.id };
        continue;
      }
      if (line.startsWith(":")) continue; // a comment: the heartbeat
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      if (field === "data") event.data.push(text);
      else if (field === "event") event.type = text;
      else if (field === "id") event.id = text;
    }
    if (buffer.length > MAX_LINE) throw new Error("an event stream line is too long");
  }
}
