// Starts fauxqs (an SQS emulator) on 127.0.0.1 only: its own command
// listens on every interface. FAUXQS_PORT picks the port (0, the default,
// takes a free one); the first line printed is the address it listens on.
import { buildApp } from "fauxqs";

const app = buildApp({ logger: false });
const address = await app.listen({ host: "127.0.0.1", port: Number(process.env.FAUXQS_PORT ?? 0) });
console.log(`fauxqs listening on ${address}`);
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => app.close().then(() => process.exit(0)));
}
