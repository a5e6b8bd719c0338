import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { CouponStock } from './coupon-stock.entity.js';
import { StockService } from './stock.service.js';

@Module({ imports: [TypeOrmModule.forFeature([CouponStock])], providers: [StockService], exports: [StockService] })
export class StockModule {}
