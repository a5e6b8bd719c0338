import { Body, Controller, Delete, Get, HttpCode, Param, Patch, Post, Query } from '@nestjs/common';
import {
  ApiBearerAuth,
  ApiBody,
  ApiCreatedResponse,
  ApiNoContentResponse,
  ApiNotFoundResponse,
  ApiOkResponse,
  ApiTags,
  ApiUnprocessableEntityResponse,
} from '@nestjs/swagger';
import { RequireRoles } from '../auth/principal.js';
import { IdPipe, OptionalBodyPipe } from '../common/validation.js';
import {
  CreatedWebhookView,
  CreateWebhookDto,
  DeliveryPage,
  ListDeliveriesQuery,
  RedeliverDto,
  RedeliveryView,
  UpdateWebhookDto,
  WebhookView,
} from './webhook.dto.js';
import { WebhookService } from './webhook.service.js';

@ApiTags('admin')
@ApiBearerAuth()
@RequireRoles('admin')
@Controller('admin/webhooks')
export class WebhookController {
  constructor(private readonly webhooks: WebhookService) {}

  @Post()
  @HttpCode(201)
  @ApiCreatedResponse({ type: CreatedWebhookView, description: 'The endpoint with its signing secret (shown only here)' })
  @ApiUnprocessableEntityResponse({ description: 'WEBHOOK_URL_NOT_ALLOWED: the host is not in WEBHOOK_ALLOWED_HOSTS' })
  create(@Body() dto: CreateWebhookDto): Promise<CreatedWebhookView> {
    return this.webhooks.create(dto);
  }

  @Get()
  @ApiOkResponse({ type: [WebhookView] })
  list(): Promise<WebhookView[]> {
    return this.webhooks.list();
  }

  @Get(':webhookId')
  @ApiOkResponse({ type: WebhookView })
  @ApiNotFoundResponse({ description: 'WEBHOOK_NOT_FOUND' })
  get(@Param('webhookId', IdPipe) id: string): Promise<WebhookView> {
    return this.webhooks.get(id);
  }

  @Patch(':webhookId')
  @ApiOkResponse({ type: WebhookView })
  @ApiNotFoundResponse({ description: 'WEBHOOK_NOT_FOUND' })
  @ApiUnprocessableEntityResponse({ description: 'WEBHOOK_URL_NOT_ALLOWED' })
  update(@Param('webhookId', IdPipe) id: string, @Body() dto: UpdateWebhookDto): Promise<WebhookView> {
    return this.webhooks.update(id, dto);
  }

  @Delete(':webhookId')
  @HttpCode(204)
  @ApiNoContentResponse({ description: 'Deleted, with its deliveries' })
  @ApiNotFoundResponse({ description: 'WEBHOOK_NOT_FOUND' })
  async remove(@Param('webhookId', IdPipe) id: string): Promise<void> {
    await this.webhooks.remove(id);
  }

  @Get(':webhookId/deliveries')
  @ApiOkResponse({ type: DeliveryPage })
  @ApiNotFoundResponse({ description: 'WEBHOOK_NOT_FOUND' })
  deliveries(@Param('webhookId', IdPipe) id: string, @Query() q: ListDeliveriesQuery): Promise<DeliveryPage> {
    return this.webhooks.deliveries(id, q);
  }

  @Post(':webhookId/redeliver')
  @HttpCode(200)
  @ApiBody({ type: RedeliverDto, required: false })
  @ApiOkResponse({ type: RedeliveryView })
  @ApiNotFoundResponse({ description: 'WEBHOOK_NOT_FOUND, WEBHOOK_DELIVERY_NOT_FOUND' })
  redeliver(
    @Param('webhookId', IdPipe) id: string,
    @Body(new OptionalBodyPipe(RedeliverDto)) body: { deliveryIds?: string[] },
  ): Promise<RedeliveryView> {
    return this.webhooks.redeliver(id, body);
  }
}
