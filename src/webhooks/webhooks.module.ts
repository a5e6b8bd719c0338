import { Module } from '@nestjs/common';
import { WebhookController } from './webhook.controller.js';
import { WebhookService } from './webhook.service.js';
import { WebhookRelay } from './relay.service.js';

/** Webhook endpoints (admin routes) and the relay that turns the state log into signed deliveries. */
@Module({
  controllers: [WebhookController],
  providers: [WebhookService, WebhookRelay],
  exports: [WebhookRelay],
})
export class WebhooksModule {}
