// Types of Pressroom's browser client (pressroom.js).

export type JobStatus = "queued" | "running" | "done" | "failed" | "cancelled";

export type JobEventType =
  | "job.queued"
  | "job.running"
  | "job.progress"
  | "job.retrying"
  | "job.done"
  | "job.failed"
  | "job.cancelled";

export type BatchEventType = "batch.progress" | "batch.done";

/** A job as GET /v1/jobs/{id} shows it. */
export interface Job {
  id: string;
  status: JobStatus;
  channel?: string | null;
  progress?: number | null;
  attempts?: number;
  max_attempts?: number;
  error?: unknown;
  /** The signed download link, once done. */
  url?: string;
  created_at?: string;
  updated_at?: string;
  [field: string]: unknown;
}

/** What every transport carries for a job's event. In the long-poll of a job (no stream),
 * events are the job's states as GET /v1/jobs/{id} answers them: without `event_id`, and
 * steps between two polls may merge into one. */
export interface JobEvent {
  event_id?: number;
  type: JobEventType;
  at: string | null;
  job: Job;
}

export interface BatchEvent {
  event_id: number;
  type: BatchEventType;
  at: string;
  batch: Record<string, unknown>;
}

export type PressroomEvent = JobEvent | BatchEvent;

/** The cursor could not be resumed from: reload state (`job` on a job's stream). */
export interface Reset {
  type: "reset";
  code: "pruned" | "unknown_cursor";
  reason: string;
  job?: Job;
}

/** An RFC 9457 problem: the body of a refusal, or one made from its status. */
export interface Problem {
  type?: string;
  title: string;
  status: number;
  detail?: string;
  errors?: Array<{ field?: string; message?: string }>;
  /** A `closed` event's code, when the stream ended and no getToken could renew it. */
  code?: string;
  [field: string]: unknown;
}

/**
 * - "connecting": first connection;
 * - "live": the stream is open (or a long-poll answered);
 * - "reconnecting": trying again (the detail says why: a `closed` event, a network error);
 * - "done": the job's stream ended (onDone);
 * - "failed": refused for good (onError);
 * - "closed": close() was called.
 */
export type WatchState = "connecting" | "live" | "reconnecting" | "done" | "failed" | "closed";

export interface WatchOptions {
  /** A subscription token (POST /v1/tokens, or a JWT your backend signs). Sent as ?token=. */
  token?: string;
  /** A fresh token from your backend: called when there is none, before the current one
   * expires (read from its `exp`), and when the server closes the stream for its token. */
  getToken?: () => string | { token: string } | Promise<string | { token: string }>;
  /** Server-side use only (Node): sent as `Authorization: Bearer`, over the long-poll. */
  apiKey?: string;
  /** Resume after this event id (a `lastEventId` kept from an earlier watch). */
  lastEventId?: string | number | null;
  /** "longpoll" to skip EventSource. Without EventSource, the long-poll is used anyway. */
  transport?: "auto" | "longpoll";
  /** How long one long-poll waits, in seconds (0-60; 25 by default). */
  waitS?: number;
  /** A stream neither open nor failed after this long is taken as held up (10 s). */
  openTimeoutMs?: number;
  onReset?: (reset: Reset) => void;
  /** The watch has stopped: refused (401, 403, 404, 422), or its token ran out without getToken. */
  onError?: (problem: Problem) => void;
  onState?: (state: WatchState, detail?: unknown) => void;
}

export interface JobWatchOptions extends WatchOptions {
  /** Each of the job's events once, in order: its history first, then live. */
  onEvent?: (event: JobEvent) => void;
  /** After the job's final event (done, failed or cancelled); the watch has stopped. */
  onDone?: (job: Job) => void;
}

export interface ChannelWatchOptions extends WatchOptions {
  /** Each event once, in log order: the tenant's (or the channel's) jobs and batches. */
  onEvent?: (event: PressroomEvent) => void;
  /** Only these event types (the server filters). */
  types?: Array<JobEventType | BatchEventType>;
}

export interface Watch {
  /** The id of the last event handled; pass it as `lastEventId` to resume elsewhere. */
  readonly lastEventId: string | null;
  readonly transport: "eventsource" | "longpoll";
  readonly state: WatchState;
  /** Stop: the stream, its timers and any request in flight. */
  close(): void;
}

/** Follow one job: its history, then live, until its final event. */
export function watchJob(baseUrl: string, jobId: string, options?: JobWatchOptions): Watch;

/** Follow a channel's events, or every job of the tenant with `null`, until close(). */
export function watchChannel(
  baseUrl: string,
  channel: string | null,
  options?: ChannelWatchOptions,
): Watch;
