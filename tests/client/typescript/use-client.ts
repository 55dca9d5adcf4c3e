// Admits an execution, waits for its result by long-poll and reads its
// events, through the SDK functions generated from /openapi.json (their
// names are the API's operation IDs). Prints one JSON line.
import { client } from "./gen/client.gen";
import { admitExecution, getExecution, listExecutionEvents } from "./gen/sdk.gen";

declare const process: { env: Record<string, string | undefined>; exit(code: number): never };

const baseUrl = process.env.FENCEPOST_URL ?? "http://127.0.0.1:8000";
const executionId = process.env.EXECUTION_ID ?? "ts-1";
client.setConfig({ baseUrl });

const admitted = await admitExecution({
  body: { workflowId: "client-echo", executionId, params: { from: "typescript" } },
});
if (admitted.error) {
  console.log(JSON.stringify({ error: admitted.error }));
  process.exit(1);
}
const done = await getExecution({
  path: { execution_id: admitted.data.executionId },
  query: { waitSeconds: 30 },
});
const history = await listExecutionEvents({ path: { execution_id: executionId } });
console.log(JSON.stringify({
  admitted: admitted.data.status,
  status: done.data?.status,
  outcome: done.data?.outcome,
  events: history.data?.events.map((e) => e.kind),
}));
