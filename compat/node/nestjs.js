// An orders endpoint in NestJS behind @node-idempotency/nestjs, configured
// as its README shows (memory storage, module defaults). Plain JavaScript:
// the decorators are applied as functions. Environment: PORT, DELAY_MS (how
// long creating an order takes, 100 by default), FAIL_MODE (how a request
// with X-Fail fails: "throw", the default, throws an
// InternalServerErrorException; "respond" sets the status to 500 itself).
'use strict';

require('reflect-metadata');
const { Module, Controller, Post, HttpCode, Body, Req, Res, InternalServerErrorException } = require('@nestjs/common');
const { NestFactory } = require('@nestjs/core');
const { NodeIdempotencyModule, Idempotent } = require('@node-idempotency/nestjs');

const port = Number(process.env.PORT || 3000);
const delay = Number(process.env.DELAY_MS ?? 100);
const failMode = process.env.FAIL_MODE || 'throw';

let created = 0;

class OrdersController {
  async create(body, req, res) {
    if (req.get('X-Fail')) {
      if (failMode === 'respond') {
        res.status(500);
        return { error: 'induced failure' };
      }
      throw new InternalServerErrorException('induced failure');
    }
    await new Promise((resolve) => setTimeout(resolve, delay));
    const id = ++created;
    res.location(`/orders/${id}`);
    return { id, order: body };
  }
}

function decorateMethod(decorators, target, key) {
  const descriptor = Reflect.decorate(decorators, target, key, Object.getOwnPropertyDescriptor(target, key));
  Object.defineProperty(target, key, descriptor);
}

Controller('orders')(OrdersController);
Body()(OrdersController.prototype, 'create', 0);
Req()(OrdersController.prototype, 'create', 1);
Res({ passthrough: true })(OrdersController.prototype, 'create', 2);
decorateMethod([Post(), HttpCode(201), Idempotent()], OrdersController.prototype, 'create');

class AppModule {}
Module({
  imports: [NodeIdempotencyModule.forRootAsync({ storage: { adapter: 'memory' } })],
  controllers: [OrdersController],
})(AppModule);

async function main() {
  const app = await NestFactory.create(AppModule, { logger: ['error'] });
  await app.listen(port, '127.0.0.1');
}

main();
