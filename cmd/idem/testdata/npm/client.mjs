// A client of the TypeScript MCP SDK for the mcp-proxy tests: it starts the
// proxy (argv[2] and on), lists the tools, calls echo, calls get-sum twice
// with one idempotency key and once with that key and other arguments, and
// prints what it got as one JSON document. With IDEM_TS_META_KEY set, the key
// goes in _meta under that name (a client of another convention, for
// mcp-proxy --meta-key), and get-sum is called twice more with one key under
// idem's default name (defaultName).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const client = new Client({ name: "idem-ts-test", version: "1.0.0" });
await client.connect(transport);

const defaultName = "io.github.idemkit/idempotency-key";
const keyName = process.env.IDEM_TS_META_KEY || defaultName;
const key = { [keyName]: "ts-sum-1" };
const tools = (await client.listTools()).tools.map((t) => t.name);
const echo = await client.callTool({ name: "echo", arguments: { message: "hi" } });
const first = await client.callTool({ name: "get-sum", arguments: { a: 4, b: 5 }, _meta: key });
const second = await client.callTool({ name: "get-sum", arguments: { b: 5, a: 4 }, _meta: key });
let conflict = null;
try {
  await client.callTool({ name: "get-sum", arguments: { a: 4, b: 6 }, _meta: key });
} catch (e) {
  conflict = { code: e.code, message: e.message, data: e.data };
}
let byDefaultName;
if (keyName !== defaultName) {
  const other = { [defaultName]: "ts-sum-2" };
  byDefaultName = [
    await client.callTool({ name: "get-sum", arguments: { a: 1, b: 1 }, _meta: other }),
    await client.callTool({ name: "get-sum", arguments: { a: 1, b: 1 }, _meta: other }),
  ];
}
const out = {
  tools,
  echo: echo.content[0].text,
  first,
  second,
  conflict,
  serverName: client.getServerVersion()?.name,
  defaultName: byDefaultName,
};
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
