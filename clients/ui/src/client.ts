/**
 * The TypeScript client, from its sources (`clients/typescript/src`): the page and every
 * other front end share one tested code path. esbuild bundles it (and eventsource-parser,
 * from that project's node_modules) into app.js.
 *
 * @module
 */
export { OutboxClient, OutboxError } from "../../typescript/src/index.js";
export type {
  BulkResult,
  Counts,
  DeliveredPrompt,
  Entry,
  EntryStatus,
  Me,
  QueueUpdate,
  SeriesMinute,
  SessionSummary,
  TurnNews,
  WatchHandle,
  WorkspaceSummary,
} from "../../typescript/src/index.js";
