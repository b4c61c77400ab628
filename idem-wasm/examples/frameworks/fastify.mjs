import Fastify from "fastify";
import { MemoryStore } from "idem";
import { idempotency } from "idem/fastify";

const app = Fastify();
await app.register(idempotency, { store: new MemoryStore(), principal: "none" });
app.post("/orders", { config: { idempotency: true } }, async (request, reply) =>
  reply.code(201).send({ id: crypto.randomUUID(), order: request.body }));
console.log(await app.listen({ port: Number(process.env.PORT ?? 3000), host: "127.0.0.1" }));
