import "reflect-metadata";
import { Body, Controller, Module, Post } from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import { MemoryStore } from "idem";
import { Idempotent, IdempotencyModule } from "idem/nestjs";

@Controller("orders")
class OrdersController {
  @Post() @Idempotent() create(@Body() order: object) { return { id: crypto.randomUUID(), order }; }
}
@Module({ imports: [IdempotencyModule.forRoot({ store: new MemoryStore(), principal: "none" })], controllers: [OrdersController] })
class AppModule {}
const app = await NestFactory.create(AppModule);
await app.listen(Number(process.env.PORT ?? 3000), "127.0.0.1");
console.log(await app.getUrl());
